# expect: correct  problem: problems/broadcast_add.py
# Honest: broadcasting add; both operands are expanded views (zero strides) read by stride.
import torch
import triton
import triton.language as tl


@triton.jit
def _broadcast_add_kernel(
    a_ptr, b_ptr, out_ptr, D1, D2, total,
    sa0, sa1, sa2, sb0, sb1, sb2, so0, so1, so2,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    i2 = offs % D2
    i1 = (offs // D2) % D1
    i0 = offs // (D2 * D1)
    a = tl.load(a_ptr + i0 * sa0 + i1 * sa1 + i2 * sa2, mask=mask, other=0.0)
    b = tl.load(b_ptr + i0 * sb0 + i1 * sb1 + i2 * sb2, mask=mask, other=0.0)
    tl.store(out_ptr + i0 * so0 + i1 * so1 + i2 * so2, a + b, mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    shape = torch.broadcast_shapes(tensor_0.shape, tensor_1.shape)
    a = tensor_0.expand(shape)
    b = tensor_1.expand(shape)
    out = torch.empty(shape, device=tensor_0.device, dtype=tensor_0.dtype)
    total = out.numel()
    BLOCK = 256
    _broadcast_add_kernel[(triton.cdiv(total, BLOCK),)](
        a, b, out, shape[1], shape[2], total,
        *a.stride(), *b.stride(), *out.stride(),
        BLOCK=BLOCK,
    )
    return [out]
