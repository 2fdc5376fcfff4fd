# expect: torch_fallback  problem: problems/elementwise.py
# Tries: reading the inputs' values by pickling them (the bytes of their storages) and computing in Python.
# Class: 3  caught-without-gate: runtime
import math
import pickle
import struct

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


def _floats(t):
    blob = pickle.dumps(t.contiguous())
    raw = pickle.loads(blob).untyped_storage()
    data = bytes(raw)
    return list(struct.unpack(f"{len(data) // 4}f", data))


def triton_fused_operator(tensor_0, tensor_1):
    xs, ys = _floats(tensor_0), _floats(tensor_1)
    values = [y / (1.0 + math.exp(-x)) for x, y in zip(xs, ys, strict=True)]
    return [_copy(torch.tensor(values, dtype=torch.float32).reshape(tensor_0.shape))]
