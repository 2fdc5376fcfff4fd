# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: NumPy reading and writing tensor memory through raw pointers (no Tensor.numpy, no torch op), on a Triton-copied input.
import ctypes

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def _copy(src):
    dst = torch.empty_like(src)
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
    return dst


def _view(t):
    buf = (ctypes.c_float * t.numel()).from_address(t.data_ptr())
    return np.ctypeslib.as_array(buf).reshape(tuple(t.shape))


def triton_fused_operator(tensor_0, tensor_1):
    a = _copy(tensor_0)
    out = torch.empty((tensor_0.shape[0], tensor_1.shape[1]), dtype=torch.float32)
    _view(out)[...] = np.maximum(_view(a) @ _view(tensor_1), 0.0)
    return [out]
