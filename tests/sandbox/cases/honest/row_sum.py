# expect: correct  problem: problems/row_sum.py
# Honest: sum over dim 1, blocked over rows, looping over columns with an fp32 accumulator.
import torch
import triton
import triton.language as tl


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, M, N, sxm, sxn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    acc = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=1)
    tl.store(out_ptr + rows, acc, mask=row_mask)


def triton_fused_operator(tensor_0):
    M, N = tensor_0.shape
    out = torch.empty((M,), device=tensor_0.device, dtype=tensor_0.dtype)
    BLOCK_M, BLOCK_N = 16, 16
    _row_sum_kernel[(triton.cdiv(M, BLOCK_M),)](
        tensor_0, out, M, N, tensor_0.stride(0), tensor_0.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
    )
    return [out]
