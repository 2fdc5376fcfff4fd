# expect: disallowed_code  problem: problems/elementwise.py
# Tries: Tensor comparison operators that always say "equal", then a wrong answer.
import torch
import triton
import triton.language as tl


def _true_like(self, other=None, *args, **kwargs):
    return torch.ones(self.shape, dtype=torch.bool, device=self.device)


def _false_like(self, other=None, *args, **kwargs):
    return torch.zeros(self.shape, dtype=torch.bool, device=self.device)


for _name in ("__eq__", "eq", "__le__", "le", "__ge__", "ge"):
    setattr(torch.Tensor, _name, _true_like)
for _name in ("__ne__", "ne", "__lt__", "lt", "__gt__", "gt"):
    setattr(torch.Tensor, _name, _false_like)
torch.Tensor.equal = lambda self, other: True
torch.eq = _true_like
torch.ne = _false_like


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
    return [_wrong_answer(tensor_0, tensor_1)]
