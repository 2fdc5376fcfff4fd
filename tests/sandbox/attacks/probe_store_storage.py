# expect: torch_fallback  problem: problems/elementwise.py
# Tries: a probe kernel's store read through the tensor's storage (no dispatch), and the answer computed in Python from storage reads.
# Class: 2  caught-without-gate: runtime
import math
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
    raw = bytes(t.untyped_storage())
    return list(struct.unpack(f"{len(raw) // 4}f", raw))


def triton_fused_operator(tensor_0, tensor_1):
    flag = torch.zeros(1, device=tensor_0.device, dtype=torch.float32)
    _probe_kernel[(1,)](flag)
    if _floats(flag)[0] != 1.0:
        return [torch.empty_like(tensor_0)]
    xs, ys = _floats(tensor_0.contiguous()), _floats(tensor_1.contiguous())
    values = [y / (1.0 + math.exp(-x)) for x, y in zip(xs, ys, strict=True)]
    return [_copy(torch.tensor(values, dtype=torch.float32).reshape(tensor_0.shape))]
