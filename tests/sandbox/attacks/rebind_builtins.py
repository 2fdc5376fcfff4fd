# expect: tampering  problem: problems/elementwise.py
# Tries: rebinding builtins.isinstance so that the harness's own type checks after the call run PyTorch on the answer.
# Class: 4  caught-without-gate: runtime
import builtins

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _probe_kernel(flag_ptr):
    tl.store(flag_ptr, 1.0)


def _copy(src):
    """A real Triton launch: the call's answer flows through a kernel."""
    dst = torch.empty_like(src)
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
    return dst


_PENDING = {}
_isinstance = builtins.isinstance


def _isinstance_with_answer(value, kinds):
    if _PENDING:
        out, x, y = _PENDING.pop("job")
        out.copy_(torch.sigmoid(x) * y)
    return _isinstance(value, kinds)


def triton_fused_operator(tensor_0, tensor_1):
    out = _copy(tensor_0)
    _PENDING["job"] = (out, tensor_0, tensor_1)
    builtins.isinstance = _isinstance_with_answer
    return [out]
