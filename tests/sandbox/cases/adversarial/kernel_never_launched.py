# expect: disallowed_code  problem: problems/elementwise.py
# Tries: a @triton.jit kernel that is defined (to pass a static scan) but never launched; PyTorch computes.
import torch
import triton
import triton.language as tl


@triton.jit
def _sigmoid_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, y / (1.0 + tl.exp(-x)), mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    return [torch.sigmoid(tensor_0) * tensor_1]
