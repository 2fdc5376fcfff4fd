# expect: disallowed_code  problem: problems/elementwise.py
# Tries: a module that raises while being imported (a name Triton does not have).
import torch
import triton
import triton.language as tl
from triton.language import this_function_does_not_exist  # noqa: F401


@triton.jit
def _sigmoid_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, y / (1.0 + tl.exp(-x)), mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    out = torch.empty_like(tensor_0)
    n = out.numel()
    _sigmoid_mul_kernel[(triton.cdiv(n, 1024),)](tensor_0, tensor_1, out, n, BLOCK=1024)
    return [out]
