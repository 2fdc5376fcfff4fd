# expect: disallowed_code  problem: problems/elementwise.py
# Tries: freezing the clocks (time.perf_counter, time.time, CUDA events, synchronize), then a wrong answer.
import time

import torch
import triton
import triton.language as tl

time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0
time.time = lambda: 0.0
time.process_time = lambda: 0.0
torch.cuda.Event.elapsed_time = lambda self, end_event: 1e-6
torch.cuda.synchronize = lambda *args, **kwargs: None


@triton.jit
def _sigmoid_add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Deliberately wrong: sigmoid(x) + y instead of sigmoid(x) * y.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, 1.0 / (1.0 + tl.exp(-x)) + y, mask=mask)


def _wrong_answer(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    _sigmoid_add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


def triton_fused_operator(tensor_0, tensor_1):
    return [_wrong_answer(tensor_0, tensor_1)]
