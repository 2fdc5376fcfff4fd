"""GPU timing shared by the grader (baselines) and the candidate process.

Each run: flush the L2 cache, record a start event, call, synchronise the whole
device (work hidden on other streams is counted), record an end event. The
candidate and the eager/compiled references are timed by this same function so
their overheads match. `bind_clock` captures the CUDA builtins before untrusted
code is imported, so patching `torch.cuda.Event` or `torch.cuda.synchronize`
later has no effect on the measurement.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

L2_FLUSH_BYTES = 256 * 2**20  # several times the L2 of current GPUs


@dataclass(frozen=True)
class Clock:
    event_type: Any
    record: Callable[..., Any]
    elapsed: Callable[..., float]
    synchronize: Callable[[], None]
    flush: Callable[[], None]


def bind_clock() -> Clock:
    import torch

    base = torch._C._CudaEventBase
    flush_buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    zero = torch.Tensor.zero_
    record = base.record
    current_stream = torch.cuda.current_stream
    return Clock(
        event_type=base,
        record=lambda event: record(event, current_stream()),
        elapsed=base.elapsed_time,
        synchronize=torch._C._cuda_synchronize,
        flush=lambda: zero(flush_buffer),
    )


def time_cuda(fn: Callable[[], Any], clock: Clock, runs: int, warmup: int) -> list[float]:
    """Milliseconds per run of `fn`, each run from a cold L2 and a synchronised device."""
    for _ in range(warmup):
        fn()
    clock.synchronize()
    pairs = []
    for _ in range(runs):
        clock.flush()
        clock.synchronize()
        start = clock.event_type(enable_timing=True)
        end = clock.event_type(enable_timing=True)
        clock.record(start)
        fn()
        clock.synchronize()
        clock.record(end)
        pairs.append((start, end))
    clock.synchronize()
    return [clock.elapsed(start, end) for start, end in pairs]


def time_wall(fn: Callable[[], Any], clock: Clock, runs: int) -> float:
    """Milliseconds per run of back-to-back calls by the host clock (a coarse cross-check)."""
    fn()
    clock.synchronize()
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    clock.synchronize()
    return (time.perf_counter() - start) * 1e3 / runs


def summarize(times_ms: list[float]) -> tuple[float, float]:
    """Median and relative interquartile range."""
    median = statistics.median(times_ms)
    if len(times_ms) < 4 or median <= 0:
        return median, 0.0
    q = statistics.quantiles(times_ms, n=4)
    return median, (q[2] - q[0]) / median
