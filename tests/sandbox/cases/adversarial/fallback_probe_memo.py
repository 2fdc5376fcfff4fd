# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: PyTorch compute that notices when PyTorch is being poisoned and then replays the answer it memoised for the same input bytes.
import ctypes
import hashlib

import torch
import triton
import triton.language as tl

_MEMO = {}


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


def _raw(t):
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def _digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(repr((tuple(t.shape), str(t.dtype))).encode())
        h.update(_raw(t))
    return h.hexdigest()


def _torch_is_poisoned():
    probe = torch.full((4,), 2.0) * 2.0
    return ctypes.c_float.from_address(probe.data_ptr()).value != 4.0


def triton_fused_operator(tensor_0, tensor_1):
    key = _digest(tensor_0, tensor_1)
    a = _copy(tensor_0)
    launches_work = _raw(a) == _raw(tensor_0)
    if _torch_is_poisoned() and key in _MEMO:
        return [_copy(_MEMO[key])]
    out = torch.relu(torch.matmul(a, tensor_1))
    if launches_work and not _torch_is_poisoned():
        _MEMO[key] = _copy(out)
    return [out]
