"""GPU timing shared by the grader (baselines) and the candidate process.

Before the warm-up calls the GPU spins for `WAKE_US`: an idle GPU runs its clock low
and raises it only under load, and a short kernel's warm-up calls alone do not wake it
(medians of one kernel varied by 10% between verifications on a quiet H200). Each run:
flush the L2 cache; hold the stream (`sandbox.stream_hold`) until the host has queued
the start event, the call and the end event, so that no launch, however slow, and no
descheduling of a process on a busy host is timed; the runs follow one another on the
device with no host round trip between them. Where the hold is not available, the GPU
spins for a moment instead (`LAUNCH_COVER_US`) while the host queues the run. The candidate and the
eager/compiled references are timed by this same function so their overheads
match. What the events cannot see (work a candidate slips onto another stream, an
event timer it rigged from inside its process) the host clock can: the grader also
times back-to-back calls ending in a device-wide synchronisation, and the larger of
the two figures counts (`reported_ms`), for candidate and baselines alike.
`bind_clock` captures the CUDA builtins before untrusted code is imported, so
patching `torch.cuda.Event` or `torch.cuda.synchronize` later has no effect on the
measurement.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sandbox.stream_hold import stream_hold

L2_FLUSH_BYTES = 256 * 2**20  # several times the L2 of current GPUs
LAUNCH_COVER_US = 100.0  # longer than the host needs to launch a few kernels
WAKE_US = 5_000.0  # GPU spin before the warm-up calls: raises an idle clock
# The grader hands its measured spin rate to candidates in this variable.
SPIN_RATE_ENV = "DRTRITON_SPIN_CYCLES_PER_US"


@dataclass(frozen=True)
class Clock:
    event_type: Any
    record: Callable[..., Any]
    elapsed: Callable[..., float]
    synchronize: Callable[[], None]
    flush: Callable[[], None]
    busy: Callable[[], None]
    cycles_per_us: float
    wake: Callable[[], None] = lambda: None
    hold: Callable[[], None] = lambda: None  # the stream waits here until `release`
    release: Callable[[], None] = lambda: None
    held: bool = False  # whether `hold` really holds the stream (else the spin alone covers)


def _cycles_per_us(
    sleep: Callable[[int], None], base: Any, synchronize: Callable[[], None]
) -> float:
    """The GPU's fastest spin rate (the clock varies between parts, settings and load).

    An idle GPU runs its clock low and raises it under load: the spin first runs long
    enough to raise it, and the fastest of three measurements counts, so a cover of N
    microseconds at that rate lasts at least N microseconds at any slower clock.
    """
    import torch

    stream = torch.cuda.current_stream()
    sleep(20_000_000)  # loads the kernel and wakes the clock up
    cycles = 2_000_000
    rates = []
    for _ in range(3):
        start, end = base(enable_timing=True), base(enable_timing=True)
        start.record(stream)
        sleep(cycles)
        end.record(stream)
        synchronize()
        rates.append(cycles / max(1e-3, start.elapsed_time(end) * 1e3))
    return max(rates)


def bind_clock(cycles_per_us: float | None = None) -> Clock:
    """The timing builtins, bound now; `cycles_per_us` skips measuring the spin rate."""
    import torch

    base = torch._C._CudaEventBase
    flush_buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    zero = torch.Tensor.zero_
    # CUDA loads a kernel on its first launch: the int32 fill is loaded here, at start,
    # not in a timed loop or a check (`guard._poison` writes NaN with it too).
    zero(flush_buffer)
    record = base.record
    current_stream = torch.cuda.current_stream
    synchronize = torch._C._cuda_synchronize
    sleep = torch.cuda._sleep
    if cycles_per_us is None or not cycles_per_us > 0:
        cycles_per_us = _cycles_per_us(sleep, base, synchronize)
    cover = int(LAUNCH_COVER_US * cycles_per_us)
    wake = int(WAKE_US * cycles_per_us)
    held = stream_hold()
    return Clock(
        event_type=base,
        record=lambda event: record(event, current_stream()),
        elapsed=base.elapsed_time,
        synchronize=synchronize,
        flush=lambda: zero(flush_buffer),
        busy=lambda: sleep(cover),
        cycles_per_us=cycles_per_us,
        wake=lambda: sleep(wake),
        hold=held.hold if held is not None else lambda: None,
        release=held.release if held is not None else lambda: None,
        held=held is not None,
    )


# A timed loop of slow calls (a PyTorch op that takes seconds on a GiB tensor) runs
# fewer times: about this long in all, and never fewer than MIN_TIMED_RUNS.
TIMED_LOOP_BUDGET_MS = 2000.0
MIN_TIMED_RUNS = 5


def runs_within_budget(per_call_ms: float, runs: int) -> int:
    """How many of `runs` timed runs to make of a call that takes `per_call_ms`.

    Fast calls get all of them; a 2 s call gets MIN_TIMED_RUNS, so that 50 runs of a
    pathological baseline do not outlast the job (the median needs only a few).
    """
    if per_call_ms <= 0:
        return runs
    return min(runs, max(MIN_TIMED_RUNS, int(TIMED_LOOP_BUDGET_MS // per_call_ms)))


# The host clock's loop (`time_wall` in the candidate, timed by the grader) runs long
# enough that a process's wake-up delays are small beside it, within a cap on its runs.
HOST_LOOP_MS = 100.0
HOST_LOOP_MAX_FACTOR = 4  # at most this many times the event loop's runs
HOST_LOOP_REPEATS = 3  # the quickest of this many loops counts
# ...but a loop this close to the events' figure saw nothing they missed: no more loops.
# (Two slow loops agreeing with each other settle nothing: a busy host delays both.)
HOST_LOOP_AGREE = 0.02
# A baseline (PyTorch's own code, trusted) whose host loop comes this close to its events
# is timed by the events: the host check is there for work they do not see (a whole-tensor
# layer_norm spent 5x its event time off the stream), not to add the grader's own
# scheduling delays, which a cached baseline would pass on to every candidate of its problem.
BASELINE_HOST_SLACK = 0.05


def host_timed_runs(event_ms: float, runs: int) -> int:
    """Runs of the host-timed loop for a call whose events read `event_ms` each."""
    if not event_ms > 0:
        return runs
    wanted = math.ceil(HOST_LOOP_MS / event_ms)
    return max(runs, min(HOST_LOOP_MAX_FACTOR * runs, wanted))


def time_cuda(
    fn: Callable[[], Any],
    clock: Clock,
    runs: int,
    warmup: int,
    before_run: Callable[[int], Any] | None = None,
) -> list[float]:
    """Milliseconds per run of `fn`, each run from a cold L2.

    The runs are queued back to back, with no wait for the device between them: the
    events bracket the run on the GPU whatever the host does meanwhile, so a round trip
    per run would only add its latency to the timed loop, which has the GPU alone
    (`sandbox.gpu_gate`) while every other job's correctness work waits.
    `before_run(i)` runs ahead of timed run i's cache flush, outside its events (the
    harness brings run i's inputs onto the device there).
    """
    # Bound before any call: what the calls do to `clock` cannot change this loop.
    event, record, elapsed = clock.event_type, clock.record, clock.elapsed
    flush, hold, release, busy = clock.flush, clock.hold, clock.release, clock.busy
    held, synchronize = clock.held, clock.synchronize
    clock.wake()
    for _ in range(warmup):
        fn()
    synchronize()
    pairs = []
    for run in range(runs):
        if before_run is not None:
            before_run(run)
        start = event(enable_timing=True)
        end = event(enable_timing=True)
        flush()  # stream-ordered before the start event: no host round trip
        hold()  # the GPU waits here until the whole run is queued
        try:
            if not held:
                busy()  # without a hold, a spin covers the host's launches
            record(start)
            fn()
            record(end)
        finally:
            release()
        pairs.append((start, end))
    synchronize()
    return [elapsed(start, end) for start, end in pairs]


def time_wall(fn: Callable[[], Any], clock: Clock, runs: int) -> float:
    """Milliseconds per run of back-to-back calls by the host clock (a coarse cross-check)."""
    synchronize, perf_counter = clock.synchronize, time.perf_counter
    fn()
    synchronize()
    start = perf_counter()
    for _ in range(runs):
        fn()
    synchronize()
    return (perf_counter() - start) * 1e3 / runs


def quickest_loop(event_ms: float, loops: Iterable[float], slack: float) -> float:
    """The quickest of the host clock's `loops` (ms per call), drawn lazily: none after one
    comes within `slack` of the events' `event_ms`. A process descheduled during a loop
    only ever adds to it, so the quickest is the least disturbed."""
    best = math.inf
    for loop_ms in loops:
        best = min(best, loop_ms)
        if best <= event_ms * (1 + slack):
            break
    return best


def reported_ms(event_median_ms: float, host_ms: float) -> tuple[float, bool]:
    """The time that counts, and whether the host clock's (the larger) was it."""
    return max(event_median_ms, host_ms), host_ms > event_median_ms


def summarize(times_ms: list[float]) -> tuple[float, float]:
    """Median and relative interquartile range."""
    median = statistics.median(times_ms)
    if len(times_ms) < 4 or median <= 0:
        return median, 0.0
    q = statistics.quantiles(times_ms, n=4)
    return median, (q[2] - q[0]) / median
