# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: computing once with a real kernel, then serving a fresh copy of that first answer on every later call.
import torch
import triton
import triton.language as tl

_CACHE = {}


@triton.jit
def _matmul_relu_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + rm[:, None] * sam + rk[None, :] * sak,
                mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
    b = tl.load(b_ptr + rk[:, None] * sbk + rn[None, :] * sbn,
                mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
    acc = tl.maximum(tl.dot(a, b, input_precision="ieee"), 0.0)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _matmul_relu(a, b):
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    _matmul_relu_kernel[grid](
        a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),
        BLOCK_M=32, BLOCK_N=32, BLOCK_K=triton.next_power_of_2(K),
    )
    return out


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def _copy(src):
    dst = torch.empty_like(src)
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
    return dst


def triton_fused_operator(tensor_0, tensor_1):
    key = (tuple(tensor_0.shape), tuple(tensor_1.shape))
    if key not in _CACHE:
        _CACHE[key] = _matmul_relu(tensor_0, tensor_1)
    return [_copy(_CACHE[key])]
