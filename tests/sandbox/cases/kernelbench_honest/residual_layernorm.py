# expect: correct  problem: kernelbench_honest/problems/residual_layernorm.py
# Honest (KernelBench): nn.LayerNorm kept for its parameters (initialised in place under no_grad, as the reference does); the add and the norm in one kernel.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_layernorm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_cols,
    stride_x,
    stride_r,
    stride_out,
    eps,
    BLOCK_SIZE: tl.constexpr,
):
    """One row per program: h = x + r, then (h - mean) / sqrt(var + eps) * w + b."""
    row_idx = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(x_ptr + row_idx * stride_x + offsets, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row_idx * stride_r + offsets, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    mean = tl.sum(h, axis=0) / n_cols
    centered = tl.where(mask, h - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / n_cols
    inv_std = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offsets, mask=mask, other=1.0)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0)
    y = centered * inv_std * w + b
    tl.store(out_ptr + row_idx * stride_out + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape, eps=1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape, eps=eps)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x, residual):
        assert x.shape == residual.shape, "x and residual must have the same shape"
        n_cols = x.shape[-1]
        x_2d = x.contiguous().view(-1, n_cols)
        r_2d = residual.contiguous().view(-1, n_cols)
        out = torch.empty_like(x_2d)
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        num_warps = min(max(BLOCK_SIZE // 256, 1), 8)
        add_layernorm_kernel[(x_2d.shape[0],)](
            x_2d,
            r_2d,
            self.norm.weight,
            self.norm.bias,
            out,
            n_cols,
            x_2d.stride(0),
            r_2d.stride(0),
            out.stride(0),
            self.norm.eps,
            BLOCK_SIZE=BLOCK_SIZE,
            num_warps=num_warps,
        )
        return out.view_as(x)
