# expect: disallowed_code  problem: problems/matmul_relu.py
# Tries: a Triton kernel launched for show (its result is thrown away) while torch.matmul/torch.relu compute the answer.
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
    _copy(tensor_0)
    return [torch.relu(torch.matmul(tensor_0, tensor_1))]
