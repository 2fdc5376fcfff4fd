# expect: correct  problem: problems/matmul_relu.py
# Honest: matmul with tl.dot and the ReLU fused into the epilogue.
import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_relu_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    sam, sak, sbk, sbn, scm, scn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        a = tl.load(
            a_ptr + rm[:, None] * sam + ks[None, :] * sak,
            mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0,
        )
        b = tl.load(
            b_ptr + ks[:, None] * sbk + rn[None, :] * sbn,
            mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0,
        )
        acc += tl.dot(a, b, input_precision="ieee")
    acc = tl.maximum(acc, 0.0)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    M, K = tensor_0.shape
    N = tensor_1.shape[1]
    out = torch.empty((M, N), device=tensor_0.device, dtype=tensor_0.dtype)
    BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _matmul_relu_kernel[grid](
        tensor_0, tensor_1, out, M, N, K,
        tensor_0.stride(0), tensor_0.stride(1), tensor_1.stride(0), tensor_1.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )
    return [out]
