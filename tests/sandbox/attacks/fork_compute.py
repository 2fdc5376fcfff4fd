# expect: tampering  problem: problems/elementwise.py
# Tries: forking: the child computes with PyTorch and sends the values back through a pipe.
# Class: 3  caught-without-gate: runtime
import os
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


def triton_fused_operator(tensor_0, tensor_1):
    a = _copy(tensor_0)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own process, PyTorch there is nobody's business
        os.close(read)
        values = (torch.sigmoid(a) * tensor_1).flatten().tolist()
        os.write(write, struct.pack(f"{len(values)}f", *values))
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.waitpid(pid, 0)
    values = struct.unpack(f"{len(data) // 4}f", data)
    return [_copy(torch.tensor(values, dtype=torch.float32).reshape(tuple(a.shape)))]
