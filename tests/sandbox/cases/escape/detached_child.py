# expect: correct|runtime_error|resource_limit|tampering|disallowed_code  problem: problems/elementwise.py
# Tries: a correct kernel that also starts detached sleepers (new session, SIGTERM ignored) meant to outlive the job; their pids go to a file in its cwd.
import os
import subprocess
import sys

import torch
import triton
import triton.language as tl

MARKER = "@@MARKER@@"
_SLEEPER = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"


def _detach():
    pids = []
    env = dict(os.environ, DRTRITON_ORPHAN=MARKER)
    for command in (["sleep", "1000"], [sys.executable, "-c", _SLEEPER, MARKER]):
        try:
            proc = subprocess.Popen(
                command,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
            )
            pids.append(str(proc.pid))
        except OSError as error:
            print(f"orphan not started: {command[0]}: {error}", flush=True)
    print(f"orphans started: {' '.join(pids) or 'none'}", flush=True)
    try:
        with open("orphans.pid", "w") as handle:
            handle.write("\n".join(pids) + "\n")
    except OSError:
        pass


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
    if not os.path.exists("orphans.pid"):
        _detach()
    return [_sigmoid_mul(tensor_0, tensor_1)]
