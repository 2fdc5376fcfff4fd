"""The job's stage clock: where a job's wall time went (`VerifyResult.stage_seconds`).

Undotted names (`queue`, `trials`, `timing`, ...) cover disjoint parts of the job; dotted
ones (`run.exchange`, `process.spawn`, ...) are parts of them (WORKSPACE.md lists them).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from sandbox.result import VerifyResult

# Stages in which a job waits for other jobs (GPU memory, the GPU gate), not for its kernel.
WAIT_STAGES = ("gpu_memory_wait", "gpu_wait", "timing_wait", "timing_overrun_wait")


def add_stage(result: VerifyResult, name: str, seconds: float) -> None:
    result.stage_seconds[name] = result.stage_seconds.get(name, 0.0) + seconds


def add_reported_stage(result: VerifyResult, name: str, seconds: Any) -> None:
    """Add seconds the candidate's harness reports (never trusted: diagnosis only)."""
    with contextlib.suppress(TypeError, ValueError, OverflowError):
        value = float(seconds)
        if math.isfinite(value) and value > 0:
            add_stage(result, name, value)


@contextlib.contextmanager
def stage(result: VerifyResult, name: str) -> Iterator[None]:
    """Add the wall time of the block to `result.stage_seconds[name]`; an out-of-memory
    error leaving it is marked with the stage (the innermost), for the job's message."""
    started = time.monotonic()
    try:
        yield
    except torch.cuda.OutOfMemoryError as err:
        if not getattr(err, "__notes__", None):
            err.add_note(f"in the grader's {name} stage")
        raise
    finally:
        add_stage(result, name, time.monotonic() - started)


def waited_s(result: VerifyResult) -> float:
    """Seconds the job spent waiting for other jobs (`WAIT_STAGES`)."""
    return sum(result.stage_seconds.get(name, 0.0) for name in WAIT_STAGES)
