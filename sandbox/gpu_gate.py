"""A host-wide gate on the GPU: correctness work shares it, a timed loop has it alone.

Graders on one GPU run jobs at once, each with its own CUDA context (the grader's and
its candidate's). When two contexts have work queued, the GPU time-slices between
them, so a kernel timed while other jobs run its trials measures their work too
(a 27 ms timed loop was seen to take 320 ms under 16 busy workers). The gate is a
reader-writer lock across processes:

- `shared()`: a job's correctness work (references, trials, comparisons). Many at once.
- `exclusive()`: one timed loop, with no shared holder on the GPU. A writer that is
  waiting blocks new readers (writer preference), so timing cannot starve.

Two `flock` files make it: the turnstile, which a writer holds from the moment it wants
the gate, and which every reader passes through; and the gate itself, shared by readers
and exclusive for the writer. The kernel drops a process's locks when it dies, so a
crashed grader cannot wedge the host. A shared hold can be given up early
(`SharedHold.release`): a grader does so when a candidate keeps the GPU longer than
its lease, so that one slow or hanging candidate delays the timed loops of others by
a bounded time only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from typing import IO


class SharedHold:
    """One process's shared hold on the gate; `release` gives it up before the block ends."""

    def __init__(self, gate: IO[bytes] | None) -> None:
        self._gate = gate
        self.waited_s = 0.0

    @property
    def held(self) -> bool:
        return self._gate is not None

    def release(self) -> None:
        if self._gate is not None:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            self._gate = None


class GpuGate:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.turnstile_path = os.path.join(directory, "gpu-gate.turnstile")
        self.gate_path = os.path.join(directory, "gpu-gate.lock")

    def _open(self, path: str) -> IO[bytes]:
        # One open file description per hold: flock belongs to it, not to the process.
        return open(path, "ab")  # noqa: SIM115 - closed by the caller's ExitStack

    @contextlib.contextmanager
    def shared(self) -> Iterator[SharedHold]:
        """Hold the gate with other correctness work; waits while a timed loop wants it."""
        started = time.monotonic()
        with self._open(self.turnstile_path) as turnstile, self._open(self.gate_path) as gate:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(gate, fcntl.LOCK_SH)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            hold = SharedHold(gate)
            hold.waited_s = time.monotonic() - started
            try:
                yield hold
            finally:
                hold.release()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[float]:
        """Hold the GPU alone; yields the seconds spent waiting for it."""
        started = time.monotonic()
        with self._open(self.turnstile_path) as turnstile, self._open(self.gate_path) as gate:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(gate, fcntl.LOCK_EX)
                try:
                    yield time.monotonic() - started
                finally:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
