# expect: disallowed_code  problem: problems/kb_linear_relu.py
# Tries (KernelBench format): calling the nn.Linear module (PyTorch) and doing only ReLU and scale in Triton.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _relu_scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) * scale, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        h = self.linear(x)
        out = torch.empty_like(h)
        n = out.numel()
        _relu_scale_kernel[(triton.cdiv(n, 1024),)](h, out, n, float(self.scale), BLOCK=1024)
        return out
