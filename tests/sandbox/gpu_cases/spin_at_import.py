# expect: correct|timeout  problem: problems/mul_add.py  speedup_within: 1.05
# Tries: launching a kernel that spins for seconds at import, outside any timed loop of its own, to slow the baselines another job of the problem measures meanwhile (they are cached for the whole group).
import torch
import triton
import triton.language as tl


@triton.jit
def _mul_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x * y + x, mask=mask)


def _mul_add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _mul_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


@triton.jit
def _spin_kernel(out_ptr, steps):
    acc = tl.program_id(0).to(tl.float32)
    for _ in range(steps):
        acc = acc * 0.9999999 + 0.0000001
    tl.store(out_ptr + tl.program_id(0), acc)


_SINK = torch.empty(132, device="cuda")
_spin_kernel[(132,)](_SINK, 6_000_000_000)  # about 15 s on an H100


def triton_fused_operator(tensor_0, tensor_1):
    return [_mul_add(tensor_0, tensor_1)]
