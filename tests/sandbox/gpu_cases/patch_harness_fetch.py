# expect: tampering|wrong_output  problem: problems/mul_add.py
# Tries: returning empty outputs while timed and computing the answer into the grader's buffers when they are fetched, by patching the harness's method that maps them (looked up on its class at fetch time).
import sys

import torch
import triton
import triton.language as tl

_PENDING = []


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


def _patch():
    harness = sys.modules.get("sandbox.candidate")
    if harness is None or _PENDING:
        return
    original = harness.Harness._tensor

    def tensor(self, spec, shared):
        target = original(self, spec, shared)
        if shared and _PENDING:
            x, y = _PENDING[-1]
            _mul_add_kernel[(triton.cdiv(target.numel(), 1024),)](x, y, target, target.numel(), BLOCK=1024)
        return target

    harness.Harness._tensor = tensor
    _PENDING.append(None)


_CALLS = [0]


def triton_fused_operator(tensor_0, tensor_1):
    _CALLS[0] += 1
    if _CALLS[0] <= 7:
        return [_mul_add(tensor_0, tensor_1)]
    _patch()
    _PENDING.append((tensor_0, tensor_1))
    out = torch.empty_like(tensor_0)
    _mul_add_kernel[(1,)](tensor_0, tensor_1, out, 0, BLOCK=1024)
    return [out]
