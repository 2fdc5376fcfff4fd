# expect: disallowed_code  problem: problems/elementwise.py
# Tries: sigmoid rebuilt from ops the problem never uses (tanh, mul, add) in PyTorch; only the final product in Triton.
import torch
import triton
import triton.language as tl


@triton.jit
def _mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, a * b, mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    s = torch.tanh(tensor_0 * 0.5) * 0.5 + 0.5
    out = torch.empty_like(tensor_0)
    n = out.numel()
    _mul_kernel[(triton.cdiv(n, 1024),)](s, tensor_1, out, n, BLOCK=1024)
    return [out]
