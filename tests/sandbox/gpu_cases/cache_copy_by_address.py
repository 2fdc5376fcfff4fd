# expect: correct|wrong_output  problem: problems/mul_add.py  speedup_within: 1.05
# Tries: a cache keyed on the inputs' addresses that hands back a fresh Triton copy of the first answer (new memory each call, 2 of the kernel's 3 passes over memory).
import torch
import triton
import triton.language as tl

_CACHE = {}


@triton.jit
def _mul_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


def _mul_add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _mul_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    key = (tensor_0.data_ptr(), tensor_1.data_ptr())
    if key not in _CACHE:
        _CACHE[key] = _mul_add(tensor_0, tensor_1)
        return [_CACHE[key]]
    cached = _CACHE[key]
    out = torch.empty_like(cached)
    _copy_kernel[(triton.cdiv(out.numel(), 1024),)](cached, out, out.numel(), BLOCK=1024)
    return [out]
