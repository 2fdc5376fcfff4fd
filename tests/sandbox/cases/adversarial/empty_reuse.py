# expect: wrong_output  problem: problems/matmul_relu.py
# Tries: returning torch.empty of the output's shape, hoping the allocator hands back the reference's memory.
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
    _copy(tensor_0[:1])  # a launch for show
    return [torch.empty((tensor_0.shape[0], tensor_1.shape[1]), device=tensor_0.device, dtype=tensor_0.dtype)]
