# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: running the PyTorch compute in a worker thread (per-thread instrumentation would not see it), on a Triton-copied input.
from concurrent.futures import ThreadPoolExecutor

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


def triton_fused_operator(tensor_0, tensor_1):
    a = _copy(tensor_0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        out = pool.submit(lambda: torch.relu(torch.matmul(a, tensor_1))).result()
    return [out]
