"""Whether Triton's CPU interpreter works here: a CPU sandbox's verdicts rest on it.

Triton 3.6's interpreter turns a scalar argument used as a loop bound into a Python int
with `int(array)`, which NumPy 2.4 refuses. Every kernel that loops over a size argument
(`for k in range(0, K, BLOCK)`, most matmuls and reductions) then fails inside the
interpreter, and a CPU sandbox would call honest kernels broken. So a CPU sandbox runs one
such kernel at start and refuses to serve, naming the versions and the fix, when it fails.
Import it only in a process that imported Triton with `TRITON_INTERPRET=1` (the CPU
zygote): Triton's own library functions are interpreted only then.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

_BLOCK = 16
_N = 40  # three loop steps, the last one ragged


@triton.jit
def _looped_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # noqa: ANN001 - a Triton kernel
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(out_ptr + tl.arange(0, BLOCK), acc)


@functools.cache
def interpreter_problem() -> str:
    """'' when a kernel looping over a scalar argument runs right in the interpreter; else why."""
    x = torch.arange(_N, dtype=torch.float32)
    out = torch.zeros(_BLOCK, dtype=torch.float32)
    try:
        _looped_sum[(1,)](x, out, _N, BLOCK=_BLOCK)
    except Exception as err:  # noqa: BLE001 - any failure is the answer
        detail = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        return (
            f"Triton {triton.__version__}'s CPU interpreter cannot run a kernel that loops over a "
            f"size argument with NumPy {np.__version__} ({detail}); install numpy<2.4 "
            "(constraints.txt pins it) or a Triton whose interpreter supports this NumPy"
        )
    expected = x.view(-1).tolist() + [0.0] * (3 * _BLOCK - _N)
    sums = [sum(expected[i::_BLOCK]) for i in range(_BLOCK)]
    if out.tolist() != sums:
        return f"Triton {triton.__version__}'s CPU interpreter computed a wrong sum: {out.tolist()}"
    return ""
