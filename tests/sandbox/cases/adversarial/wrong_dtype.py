# expect: wrong_output  problem: problems/elementwise.py
# Tries: the right values stored as float64 instead of float32.
import torch
import triton
import triton.language as tl


@triton.jit
def _sigmoid_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    val = y / (1.0 + tl.exp(-x))
    tl.store(out_ptr + offs, val.to(tl.float64), mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    out = torch.empty(tensor_0.shape, device=tensor_0.device, dtype=torch.float64)
    n = out.numel()
    _sigmoid_mul_kernel[(triton.cdiv(n, 1024),)](tensor_0, tensor_1, out, n, BLOCK=1024)
    return [out]
