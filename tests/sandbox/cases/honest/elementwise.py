# expect: correct  problem: problems/elementwise.py
# Honest: sigmoid(x) * y in one 2-D elementwise kernel that reads strides at run time.
import torch
import triton
import triton.language as tl


@triton.jit
def _sigmoid_mul_kernel(
    x_ptr, y_ptr, out_ptr, M, N,
    sxm, sxn, sym, syn, som, son,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0)
    y = tl.load(y_ptr + rows[:, None] * sym + cols[None, :] * syn, mask=mask, other=0.0)
    x = x.to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-x))
    out = s * y.to(tl.float32)
    tl.store(out_ptr + rows[:, None] * som + cols[None, :] * son, out, mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    M, N = tensor_0.shape
    out = torch.empty((M, N), device=tensor_0.device, dtype=tensor_0.dtype)
    BLOCK_M, BLOCK_N = 16, 32
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _sigmoid_mul_kernel[grid](
        tensor_0, tensor_1, out, M, N,
        tensor_0.stride(0), tensor_0.stride(1),
        tensor_1.stride(0), tensor_1.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )
    return [out]
