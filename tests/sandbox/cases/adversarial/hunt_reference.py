# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: searching the caller's stack frames and the garbage collector for the reference output and returning a copy.
import gc
import sys

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


def _tensors_in(value, depth=0):
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item, depth + 1)
    elif depth < 2 and hasattr(value, "__dict__") and not isinstance(value, type):
        try:
            items = list(vars(value).values())
        except TypeError:
            items = []
        for item in items:
            yield from _tensors_in(item, depth + 1)


def _candidates():
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            yield from _tensors_in(value)
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            yield obj


def triton_fused_operator(tensor_0, tensor_1):
    shape = (tensor_0.shape[0], tensor_1.shape[1])
    own = {tensor_0.data_ptr(), tensor_1.data_ptr()}
    for found in _candidates():
        try:
            if (
                tuple(found.shape) == shape
                and found.dtype == tensor_0.dtype
                and found.device == tensor_0.device
                and found.data_ptr() not in own
            ):
                return [_copy(found.detach())]
        except Exception:
            continue
    return [_copy(torch.zeros(shape, device=tensor_0.device, dtype=tensor_0.dtype))]
