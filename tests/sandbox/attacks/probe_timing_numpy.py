# expect: torch_fallback|runtime_error  problem: problems/elementwise.py
# Tries: telling the no-launch call by the time a probe launch takes, and computing in NumPy over the tensors' raw memory (an __array_interface__, no ctypes) when it is not.
# Class: 2  caught-without-gate: gate
import time

import numpy
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


class _Raw:
    def __init__(self, t):
        self.__array_interface__ = {
            "data": (t.data_ptr(), False),
            "shape": tuple(t.shape),
            "strides": tuple(s * t.element_size() for s in t.stride()),
            "typestr": "<f4",
            "version": 3,
        }


def triton_fused_operator(tensor_0, tensor_1):
    flag = torch.zeros(1, device=tensor_0.device, dtype=torch.float32)
    started = time.perf_counter()
    _probe_kernel[(1,)](flag)
    if time.perf_counter() - started < 2e-4:  # a launch that did nothing
        return [torch.empty_like(tensor_0)]
    out = torch.empty_like(tensor_0)
    x, y = numpy.asarray(_Raw(tensor_0)), numpy.asarray(_Raw(tensor_1))
    numpy.asarray(_Raw(out))[...] = y / (1.0 + numpy.exp(-x))
    return [_copy(out)]
