# expect: disallowed_code  problem: problems/elementwise.py
# Tries: overwriting an input as scratch space, and hiding it by making every tensor-equality check in the process say "unchanged".
import torch
import triton
import triton.language as tl


def _same(*args, **kwargs):
    return True


torch.equal = _same
torch.Tensor.equal = _same
torch.allclose = _same
torch.Tensor.allclose = _same


@triton.jit
def _sigmoid_inplace_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(x_ptr + offs, 1.0 / (1.0 + tl.exp(-x)), mask=mask)


@triton.jit
def _mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, a * b, mask=mask)


def _sigmoid_mul_using_input_as_scratch(x, y):
    n = x.numel()
    grid = (triton.cdiv(n, 1024),)
    _sigmoid_inplace_kernel[grid](x, n, BLOCK=1024)  # overwrites the input
    out = torch.empty_like(x)
    _mul_kernel[grid](x, y, out, n, BLOCK=1024)
    return out


def triton_fused_operator(tensor_0, tensor_1):
    torch.equal = _same
    return [_sigmoid_mul_using_input_as_scratch(tensor_0, tensor_1)]
