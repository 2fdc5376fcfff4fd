# expect: correct  problem: kernelbench_honest/problems/scaled_softmax.py
# Honest (KernelBench): a row softmax over any leading dims (flattened with view), one program per row, block padded to a power of two.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scaled_softmax_kernel(
    out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, scale, BLOCK_SIZE: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32) * scale
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    den = tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, num / den, mask=mask)


def _num_warps(block_size: int) -> int:
    if block_size >= 4096:
        return 16
    if block_size >= 2048:
        return 8
    return 4


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = float(scale)

    def forward(self, x):
        shape = x.shape
        n_cols = shape[-1]
        x2d = x.contiguous().view(-1, n_cols)
        n_rows = x2d.shape[0]
        out = torch.empty_like(x2d)
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        scaled_softmax_kernel[(n_rows,)](
            out,
            x2d,
            x2d.stride(0),
            out.stride(0),
            n_cols,
            self.scale,
            BLOCK_SIZE=BLOCK_SIZE,
            num_warps=_num_warps(BLOCK_SIZE),
        )
        return out.view(shape)
