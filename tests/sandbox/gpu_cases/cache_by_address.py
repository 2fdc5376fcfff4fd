# expect: correct|wrong_output  problem: problems/mul_add.py  speedup_within: 1.05
# Tries: answering from a cache keyed on the inputs' addresses, returning the tensor computed the first time those inputs came (timed runs used to get the same inputs every time).
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


def triton_fused_operator(tensor_0, tensor_1):
    key = (tensor_0.data_ptr(), tensor_1.data_ptr())
    if key not in _CACHE:
        _CACHE[key] = _mul_add(tensor_0, tensor_1)
    return [_CACHE[key]]
