# expect: tampering  problem: problems/elementwise.py
# Tries: registering a Python kernel for an op with torch.library, so that a launch-free op the guard allows computes the answer.
# Class: 3  caught-without-gate: runtime
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


_ANSWER = {}


def _zeros_like_answer(self, *args, **kwargs):
    return _ANSWER.pop("out")


def triton_fused_operator(tensor_0, tensor_1):
    a = _copy(tensor_0)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("zeros_like", _zeros_like_answer, "CPU")
    _ANSWER["out"] = torch.sigmoid(a) * tensor_1
    return [torch.zeros_like(a)]
