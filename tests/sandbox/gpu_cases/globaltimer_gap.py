# expect: tampering|wrong_output  problem: problems/mul_add.py
# Tries: reading %globaltimer in the kernel and skipping the work when the previous call ended under a millisecond ago (back-to-back timed runs; trials are further apart).
import torch
import triton
import triton.language as tl

_STAMP = []


@triton.jit
def _mul_add_kernel(x_ptr, y_ptr, out_ptr, stamp_ptr, n, BLOCK: tl.constexpr):
    now = tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )
    before = tl.load(stamp_ptr)
    if tl.program_id(0) == 0:
        tl.store(stamp_ptr, now)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (now - before >= 1_000_000)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


def triton_fused_operator(tensor_0, tensor_1):
    if not _STAMP:
        _STAMP.append(torch.zeros(1, dtype=torch.int64, device=tensor_0.device))
    out = torch.empty_like(tensor_0)
    n = out.numel()
    _mul_add_kernel[(triton.cdiv(n, 1024),)](tensor_0, tensor_1, out, _STAMP[0], n, BLOCK=1024)
    return [out]
