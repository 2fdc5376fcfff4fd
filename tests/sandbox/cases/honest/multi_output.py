# expect: correct  problem: problems/multi_output.py
# Honest: one pass per row produces both outputs, relu(a + b) and the row sums of a + b.
import torch
import triton
import triton.language as tl


@triton.jit
def _add_relu_sum_kernel(
    a_ptr, b_ptr, relu_ptr, sum_ptr, N, sam, san, sbm, sbn, srm, srn, BLOCK_N: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    a = tl.load(a_ptr + row * sam + cols * san, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * sbm + cols * sbn, mask=mask, other=0.0).to(tl.float32)
    s = a + b
    tl.store(relu_ptr + row * srm + cols * srn, tl.maximum(s, 0.0), mask=mask)
    tl.store(sum_ptr + row, tl.sum(tl.where(mask, s, 0.0), axis=0))


def triton_fused_operator(tensor_0, tensor_1):
    M, N = tensor_0.shape
    relu_out = torch.empty((M, N), device=tensor_0.device, dtype=tensor_0.dtype)
    sum_out = torch.empty((M,), device=tensor_0.device, dtype=tensor_0.dtype)
    _add_relu_sum_kernel[(M,)](
        tensor_0, tensor_1, relu_out, sum_out, N,
        tensor_0.stride(0), tensor_0.stride(1), tensor_1.stride(0), tensor_1.stride(1),
        relu_out.stride(0), relu_out.stride(1),
        BLOCK_N=triton.next_power_of_2(N),
    )
    return [relu_out, sum_out]
