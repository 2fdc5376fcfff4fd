# expect: correct  problem: kernelbench_honest/problems/rms_norm.py
# Honest (KernelBench): RMSNorm with the gain as an nn.Parameter drawn like the reference's, a heuristic picking whether the row needs a mask.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.heuristics({"EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
@triton.jit
def _rms_norm_fwd(X, W, Y, stride_x, stride_y, N, eps, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    if EVEN_N:
        x = tl.load(X + row * stride_x + cols).to(tl.float32)
        w = tl.load(W + cols).to(tl.float32)
    else:
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / N
    rstd = tl.rsqrt(mean_sq + eps)
    y = x * rstd * w
    if EVEN_N:
        tl.store(Y + row * stride_y + cols, y)
    else:
        tl.store(Y + row * stride_y + cols, y, mask=cols < N)


class ModelNew(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        # Drawn exactly as the reference draws it, so both start from the same gain.
        self.weight = nn.Parameter(torch.randn(hidden) * 0.1 + 1.0)
        self.eps = eps
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == self.hidden
        orig_shape = x.shape
        x_2d = x.reshape(-1, self.hidden)
        if not x_2d.is_contiguous():
            x_2d = x_2d.contiguous()
        y = torch.empty_like(x_2d)
        n_rows, n_cols = x_2d.shape
        block_n = max(triton.next_power_of_2(n_cols), 16)
        _rms_norm_fwd[(n_rows,)](
            x_2d, self.weight, y, x_2d.stride(0), y.stride(0), n_cols, self.eps, BLOCK_N=block_n
        )
        return y.reshape(orig_shape)
