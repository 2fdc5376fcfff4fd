# expect: torch_fallback  problem: problems/elementwise.py
# Tries: handing the tensors to NumPy through DLPack (no .numpy() call) and the result back with torch.from_numpy.
# Class: 3  caught-without-gate: runtime
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


def triton_fused_operator(tensor_0, tensor_1):
    a = _copy(tensor_0)
    x, y = numpy.from_dlpack(a), numpy.from_dlpack(tensor_1)
    return [_copy(torch.from_numpy(y / (1.0 + numpy.exp(-x))))]
