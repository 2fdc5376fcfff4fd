# expect: disallowed_code  problem: problems/elementwise.py
# Tries: asking NumPy for 64 GiB in 1 GiB arrays, each written and kept alive, after computing the right answer.
import numpy as np
import torch
import triton
import triton.language as tl

TARGET = 64 << 30
CHUNK = 1 << 30


@triton.jit
def _sigmoid_mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, y / (1.0 + tl.exp(-x)), mask=mask)


def _sigmoid_mul(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _sigmoid_mul_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


def triton_fused_operator(tensor_0, tensor_1):
    out = _sigmoid_mul(tensor_0, tensor_1)
    chunks = []
    while len(chunks) * CHUNK < TARGET:
        chunk = np.empty(CHUNK, dtype=np.uint8)
        chunk.fill(1)  # memory really used, not only reserved
        chunks.append(chunk)
    return [out]
