# expect: correct  problem: problems/layernorm.py
# Honest: layer norm over the last dim, one program per row, fp32 statistics.
import torch
import triton
import triton.language as tl


@triton.jit
def _layernorm_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, N, sxm, sxn, som, son, eps, BLOCK_N: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * sxm + cols * sxn, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * som + cols * son, diff * rstd * w + b, mask=mask)


def triton_fused_operator(tensor_0, tensor_1, tensor_2):
    M, N = tensor_0.shape
    out = torch.empty((M, N), device=tensor_0.device, dtype=tensor_0.dtype)
    _layernorm_kernel[(M,)](
        tensor_0, tensor_1, tensor_2, out, N,
        tensor_0.stride(0), tensor_0.stride(1), out.stride(0), out.stride(1), 1e-05,
        BLOCK_N=triton.next_power_of_2(N),
    )
    return [out]
