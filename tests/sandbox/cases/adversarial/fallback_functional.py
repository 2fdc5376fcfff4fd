# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: the matmul through torch.nn.functional.linear (not the problem's torch.matmul), the ReLU in Triton.
import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _relu_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.maximum(tl.load(src_ptr + offs, mask=mask, other=0.0), 0.0), mask=mask)


def _relu(src):
    dst = torch.empty_like(src)
    n = src.numel()
    _relu_kernel[(triton.cdiv(n, 1024),)](src, dst, n, BLOCK=1024)
    return dst


def triton_fused_operator(tensor_0, tensor_1):
    return [_relu(F.linear(tensor_0, tensor_1.t()))]
