# expect: correct  problem: kernelbench_honest/problems/mean_over_dim.py
# Honest (KernelBench): the reduced dim moved last by permute (a view), then a strided reduction, one program per output element; the output shape computed on the host.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mean_last_kernel(
    x_ptr,
    out_ptr,
    n_outer,
    n_inner,
    n_reduce,
    stride_outer,
    stride_inner,
    stride_reduce,
    BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    outer = pid // n_inner
    inner = pid % n_inner
    base = x_ptr + outer * stride_outer + inner * stride_inner
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    for start in range(0, n_reduce, BLOCK_R):
        r = start + tl.arange(0, BLOCK_R)
        acc += tl.load(base + r * stride_reduce, mask=r < n_reduce, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0) / n_reduce)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"expected a 3-D input, got {x.dim()} dims")
        dim = self.dim % x.dim()
        order = [d for d in range(x.dim()) if d != dim] + [dim]
        xp = x.permute(*order)  # no copy: the kernel reads through strides
        n_outer, n_inner, n_reduce = xp.shape
        out_shape = [s for d, s in enumerate(x.shape) if d != dim]
        out = torch.empty(out_shape, device=x.device, dtype=x.dtype)
        BLOCK_R = min(triton.next_power_of_2(n_reduce), 1024)
        mean_last_kernel[(n_outer * n_inner,)](
            xp,
            out,
            n_outer,
            n_inner,
            n_reduce,
            xp.stride(0),
            xp.stride(1),
            xp.stride(2),
            BLOCK_R=BLOCK_R,
        )
        return out
