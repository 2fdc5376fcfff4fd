# expect: correct  problem: problems/softmax.py
# Honest: numerically stable row softmax, one program per row, masked to the row length.
import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, N, sxm, sxn, som, son, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * sxm + cols * sxn, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.where(mask, tl.exp(x), 0.0)
    out = e / tl.sum(e, axis=0)
    tl.store(out_ptr + row * som + cols * son, out, mask=mask)


def triton_fused_operator(tensor_0):
    M, N = tensor_0.shape
    out = torch.empty((M, N), device=tensor_0.device, dtype=tensor_0.dtype)
    _softmax_kernel[(M,)](
        tensor_0, out, N, tensor_0.stride(0), tensor_0.stride(1), out.stride(0), out.stride(1),
        BLOCK_N=triton.next_power_of_2(N),
    )
    return [out]
