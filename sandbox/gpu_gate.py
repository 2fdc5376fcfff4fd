"""A host-wide gate on the GPU: correctness work shares it, a timed loop has it alone.

Graders on one GPU run jobs at once, each with its own CUDA context (the grader's and
its candidate's). When two contexts have work queued, the GPU time-slices between
them, so a kernel timed while other jobs run its trials measures their work too
(a 27 ms timed loop was seen to take 320 ms under 16 busy workers). The gate is a
reader-writer lock across processes:

- `shared()`: a job's correctness work (references, trials, comparisons). Many at once.
- `exclusive()`: one timed loop, with no shared holder on the GPU. While any writer
  waits, no new reader starts (writer preference), so timing cannot starve; and the
  writers waiting then take the GPU one after another, so that one drain of the readers
  serves all of them. A drain costs the GPU: it runs only the work of the readers still
  finishing, while new ones wait. (With one turnstile, readers slipped in between two
  waiting writers, and each writer drained them again.)

Two `flock` files make it: the writers' file, held shared by every writer from the moment
it wants the gate until it has let it go, which a reader must hold exclusively (no
writer waiting) for the moment it takes its share; and the gate itself, shared by
readers and exclusive for one writer at a time. The kernel drops a process's locks when
it dies, so a crashed grader cannot wedge the host. A shared hold can be given up early
(`SharedHold.release`): a grader does so when a candidate keeps the GPU longer than
its lease, so that one slow or hanging candidate delays the timed loops of others by
a bounded time only. Such a call goes on running on the GPU, though: it marks the GPU
busy (`SharedHold.overrun`, a shared lock on a third file) until its block ends, and a
timed loop that has the gate waits, for a bounded time, until no such mark is left
(`exclusive(quiet_within=...)`). No new overrun can start meanwhile: overruns come from
shared holders, and a timed loop has the gate only when there are none.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

QUIET_POLL_S = 0.005  # how often a timed loop looks for the end of other jobs' overruns


class SharedHold:
    """One process's shared hold on the gate; `release` gives it up before the block ends,
    `overrun` too, while marking the GPU busy until the block ends."""

    def __init__(self, gate: IO[bytes] | None, overrun_path: str = "") -> None:
        self._gate = gate
        self._overrun_path = overrun_path
        self._overrun: IO[bytes] | None = None
        self.waited_s = 0.0

    @property
    def held(self) -> bool:
        return self._gate is not None

    def release(self) -> None:
        if self._gate is not None:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            self._gate = None

    def overrun(self) -> None:
        """Give the gate up for a call that keeps running past its lease: the GPU is
        marked busy (before the gate goes, so a timed loop never sees neither) until
        the block ends, and timed loops wait for that mark, within their bound."""
        if self._gate is None:
            return
        if self._overrun_path and self._overrun is None:
            self._overrun = open(self._overrun_path, "ab")  # noqa: SIM115 - closed in `end`
            fcntl.flock(self._overrun, fcntl.LOCK_SH)
        self.release()

    def end(self) -> None:
        self.release()
        if self._overrun is not None:
            self._overrun.close()  # drops its lock
            self._overrun = None


@dataclass
class ExclusiveHold:
    """What a timed loop waited for: the gate, then other jobs' overruns (`quiet` when
    none was left running on the GPU)."""

    waited_s: float
    overrun_wait_s: float = 0.0
    quiet: bool = True


class GpuGate:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.writers_path = os.path.join(directory, "gpu-gate.writers")
        self.gate_path = os.path.join(directory, "gpu-gate.lock")
        self.overrun_path = os.path.join(directory, "gpu-gate.overrun")

    def _open(self, path: str) -> IO[bytes]:
        # One open file description per hold: flock belongs to it, not to the process.
        return open(path, "ab")  # noqa: SIM115 - closed by the caller's ExitStack

    @contextlib.contextmanager
    def shared(self) -> Iterator[SharedHold]:
        """Hold the gate with other correctness work; waits while any timed loop wants it."""
        started = time.monotonic()
        with self._open(self.writers_path) as writers, self._open(self.gate_path) as gate:
            fcntl.flock(writers, fcntl.LOCK_EX)  # no writer waits or holds the gate now...
            try:
                fcntl.flock(gate, fcntl.LOCK_SH)  # ...so this never waits
            finally:
                fcntl.flock(writers, fcntl.LOCK_UN)
            hold = SharedHold(gate, self.overrun_path)
            hold.waited_s = time.monotonic() - started
            try:
                yield hold
            finally:
                hold.end()

    @contextlib.contextmanager
    def exclusive(self, quiet_within: float = 0.0) -> Iterator[ExclusiveHold]:
        """Hold the GPU alone, then wait up to `quiet_within` seconds for other jobs'
        overrunning calls to end; yields what was waited for."""
        started = time.monotonic()
        with self._open(self.writers_path) as writers, self._open(self.gate_path) as gate:
            fcntl.flock(writers, fcntl.LOCK_SH)  # from now on no new reader starts
            try:
                fcntl.flock(gate, fcntl.LOCK_EX)
                try:
                    got_gate = time.monotonic()
                    quiet = self._wait_quiet(got_gate + quiet_within)
                    yield ExclusiveHold(
                        got_gate - started, time.monotonic() - got_gate, quiet=quiet
                    )
                finally:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            finally:
                fcntl.flock(writers, fcntl.LOCK_UN)  # after the gate: readers never wait on it

    def _wait_quiet(self, until: float) -> bool:
        """Whether every overrun mark was gone by `until` (looked at once at least)."""
        with self._open(self.overrun_path) as overrun:
            while True:
                try:
                    fcntl.flock(overrun, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if time.monotonic() >= until:
                        return False
                    time.sleep(QUIET_POLL_S)
                    continue
                fcntl.flock(overrun, fcntl.LOCK_UN)
                return True
