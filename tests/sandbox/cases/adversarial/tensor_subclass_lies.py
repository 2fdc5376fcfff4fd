# expect: disallowed_code  problem: problems/elementwise.py
# Tries: returning a Tensor subclass whose comparisons (==, allclose, isclose, equal, isnan) all say "matches".
import torch
import triton
import triton.language as tl

_TRUE = {"allclose", "equal", "__eq__", "eq", "__le__", "__ge__", "isfinite"}
_FALSE = {"__ne__", "ne", "isnan", "isinf"}
_ALL_TRUE = {"isclose"}


class _Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("allclose", "equal"):
            return True
        if name in _TRUE or name in _ALL_TRUE:
            return torch.ones(args[0].shape, dtype=torch.bool)
        if name in _FALSE:
            return torch.zeros(args[0].shape, dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs or {})


@triton.jit
def _sigmoid_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Deliberately wrong: sigmoid(x) + y instead of sigmoid(x) * y.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, 1.0 / (1.0 + tl.exp(-x)) + y, mask=mask)


def _wrong_answer(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _sigmoid_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


def triton_fused_operator(tensor_0, tensor_1):
    return [_wrong_answer(tensor_0, tensor_1).as_subclass(_Agreeable)]
