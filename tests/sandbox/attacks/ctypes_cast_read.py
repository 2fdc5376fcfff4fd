# expect: torch_fallback  problem: problems/elementwise.py
# Tries: reading and writing tensor memory through ctypes.cast pointers (no from_address, no dlopen) and computing in Python.
# Class: 3  caught-without-gate: runtime
import ctypes
import math

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


def _pointer(t):
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctypes.c_float))


def triton_fused_operator(tensor_0, tensor_1):
    out = torch.empty_like(tensor_0)
    x, y, o = _pointer(tensor_0), _pointer(tensor_1), _pointer(out)
    for i in range(out.numel()):
        o[i] = y[i] / (1.0 + math.exp(-x[i]))
    return [_copy(out)]
