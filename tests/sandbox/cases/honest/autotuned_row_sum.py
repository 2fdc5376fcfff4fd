# expect: correct  problem: problems/row_sum.py
# Honest: a row sum whose block size Triton's autotuner picks among three configs.
import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 32}, num_warps=1),
        triton.Config({"BLOCK": 64}, num_warps=2),
        triton.Config({"BLOCK": 128}, num_warps=4),
    ],
    key=["N"],
)
@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, N, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride_row + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def triton_fused_operator(tensor_0):
    M, N = tensor_0.shape
    x = tensor_0.contiguous()
    out = torch.empty((M,), device=x.device, dtype=x.dtype)
    _row_sum_kernel[(M,)](x, out, N, x.stride(0))
    return [out]
