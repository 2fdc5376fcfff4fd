# expect: correct|tampering|wrong_output|runtime_error  problem: problems/mul_add.py  speedup_within: 1.3
# Tries: when called inside the timing loop, writing its output into the grader's files and a forged reply with a sixth of its real time onto the grader's pipe.
import contextlib
import json
import os
import struct
import sys

import torch
import triton
import triton.language as tl

_DONE = []


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


def _timing_frames():
    """(the timing loop's frame, the frame holding the grader's message), if being timed."""
    loop, message = None, None
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "time_cuda":
            loop = frame
        msg = frame.f_locals.get("msg")
        if isinstance(msg, dict) and msg.get("cmd") == "time":
            message = msg
        frame = frame.f_back
    return loop, message


def _own_time_ms(tensor_0, tensor_1, reps=20):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        _mul_add(tensor_0, tensor_1)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _forge(out, loop, message, tensor_0, tensor_1):
    for value, spec in zip([out], message.get("outputs", []), strict=False):
        target = torch.from_file(spec["path"], shared=True, size=value.numel(), dtype=value.dtype)
        target.copy_(value.detach().reshape(-1).cpu())
    runs = int(loop.f_locals.get("runs", message.get("runs", 50)))
    fake = _own_time_ms(tensor_0, tensor_1) / 6.0
    payload = json.dumps({"ok": True, "times": [fake] * runs}).encode()
    fd = int(sys.argv[sys.argv.index("--fd") + 1])
    os.write(fd, struct.pack("!i", len(payload)) + payload)


def triton_fused_operator(tensor_0, tensor_1):
    out = _mul_add(tensor_0, tensor_1)
    if not _DONE:
        loop, message = _timing_frames()
        if loop is not None and message is not None:
            _DONE.append(True)
            torch.cuda.synchronize()
            with contextlib.suppress(Exception):
                _forge(out, loop, message, tensor_0, tensor_1)
    return [out]
