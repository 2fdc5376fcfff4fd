# expect: disallowed_code  problem: problems/elementwise.py  options: {"time_budget_s": 6}
# Tries: never returning, with SIGTERM, SIGINT, SIGHUP and SIGALRM ignored so only SIGKILL ends it.
import signal
import time

import torch
import triton
import triton.language as tl


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
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, signal.SIG_IGN)
    out = _sigmoid_mul(tensor_0, tensor_1)
    while True:
        time.sleep(0.2)
    return [out]
