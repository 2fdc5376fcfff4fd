# expect: wrong_output  problem: problems/col_sum_keepdim.py
# Tries: the right column sums with shape [48] instead of [1, 48]; a broadcasting allclose would accept it.
import torch
import triton
import triton.language as tl


@triton.jit
def _col_sum_kernel(x_ptr, out_ptr, M, N, sxm, sxn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0)
    tl.store(out_ptr + cols, tl.sum(x, axis=0), mask=cols < N)


def triton_fused_operator(tensor_0):
    M, N = tensor_0.shape
    out = torch.empty((N,), device=tensor_0.device, dtype=tensor_0.dtype)  # should be (1, N)
    _col_sum_kernel[(triton.cdiv(N, 16),)](
        tensor_0, out, M, N, tensor_0.stride(0), tensor_0.stride(1),
        BLOCK_M=triton.next_power_of_2(M), BLOCK_N=16,
    )
    return [out]
