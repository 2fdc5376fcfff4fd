"""Whether the GPU is idle of every other process: a measured probe around the baselines.

A baseline is measured once per problem and every candidate of the problem is scored
against it, so a baseline slowed by someone else's kernel (a job's spinning kernel, a
finished job's process not yet gone) inflates a whole group's speedups. The GPU gate keeps
other graders' work off the GPU while a baseline is timed, but not work a process queued
outside it. So the grader times a known kernel, `IDLE_PROBE_SPINS` short spins back to
back (`Clock.busy`, about `timing.LAUNCH_COVER_US` each), with CUDA events: on an idle GPU
it takes what it took when the grader started (`IdleProbe.idle_ms`, the quickest reading
seen since); another context with work queued takes time slices from it, and it reads
slower. Past `IDLE_MARGIN` above the idle figure, the GPU was not idle.

The probe runs before and after the baseline loops. When either reads busy, the baselines
are thrown away and measured again after a pause (`BASELINE_ATTEMPTS` in all); if the GPU
never reads idle, the problem gets no baselines this time rather than wrong ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Spins of the probe: about 10 ms in all, longer than the driver's time slice, so that a
# context with work queued gets at least one slice inside the probe.
IDLE_PROBE_SPINS = 100
# A probe this much slower than idle means the GPU was shared.
IDLE_MARGIN = 0.25
# Tries at a baseline measurement that the probe finds idle before and after it.
BASELINE_ATTEMPTS = 3
# Pause before the second, third ... try: time for another job's kernel to end.
BUSY_PAUSES_S = (0.5, 2.0)


def is_idle(measured_ms: float, idle_ms: float, margin: float = IDLE_MARGIN) -> bool:
    """Whether a probe reading `measured_ms` ran on an idle GPU (idle: `idle_ms`)."""
    if not (idle_ms > 0 and measured_ms > 0):
        return True  # nothing to judge by: no verdict against the GPU
    return measured_ms <= idle_ms * (1.0 + margin)


def pauses(attempts: int = BASELINE_ATTEMPTS) -> Iterator[float]:
    """Seconds to wait before each try (none before the first)."""
    for attempt in range(attempts):
        yield 0.0 if attempt == 0 else BUSY_PAUSES_S[min(attempt - 1, len(BUSY_PAUSES_S) - 1)]


@dataclass
class ProbeReading:
    ms: float
    idle: bool


class IdleProbe:
    """Times the probe kernel on `clock`'s stream; `idle_ms` is the quickest reading yet."""

    def __init__(self, clock: Any, spins: int = IDLE_PROBE_SPINS) -> None:
        self.clock = clock
        self.spins = spins
        self.idle_ms = 0.0

    def measure(self) -> float:
        """Milliseconds of the probe, the GPU's clock raised first."""
        clock = self.clock
        clock.wake()
        start = clock.event_type(enable_timing=True)
        end = clock.event_type(enable_timing=True)
        clock.record(start)
        for _ in range(self.spins):
            clock.busy()
        clock.record(end)
        clock.synchronize()
        return float(clock.elapsed(start, end))

    def calibrate(self, readings: int = 3) -> float:
        """The idle figure, from the quickest of `readings` probes (call with the GPU alone)."""
        self.idle_ms = min(self.measure() for _ in range(readings))
        return self.idle_ms

    def check(self) -> ProbeReading:
        """A probe now, judged against the idle figure (which a quicker reading lowers)."""
        ms = self.measure()
        idle = is_idle(ms, self.idle_ms)
        if ms > 0 and (self.idle_ms <= 0 or ms < self.idle_ms):
            self.idle_ms = ms
        return ProbeReading(ms, idle)


def measure_while_idle(
    probe: IdleProbe | None,
    measure: Callable[[], dict[str, float | None]],
    hold: Callable[[], Any],
    settle: Callable[[], None],
    sleep: Callable[[float], None],
    note: Callable[[str, float], None],
    attempts: int = BASELINE_ATTEMPTS,
) -> dict[str, float | None] | None:
    """`measure()` under `hold()`, with the probe idle before and after it; measured again
    (after `settle()` and a pause) when it was not. None when the GPU never read idle.
    `note(stage, seconds)` records the probes' and the lost tries' time."""
    import time

    if probe is None:
        with hold():
            return measure()
    for pause in pauses(attempts):
        if pause:
            settle()
            sleep(pause)
        began = time.monotonic()
        with hold():
            before = probe.check()
            note("baseline.probe", time.monotonic() - began)
            if before.idle:
                values = measure()
                probed = time.monotonic()
                after = probe.check()
                note("baseline.probe", time.monotonic() - probed)
                if after.idle:
                    return values
        note("baseline.busy", time.monotonic() - began)
    return None
