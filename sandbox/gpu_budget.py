"""A host-wide budget of GPU memory, shared by the grader processes of one sandbox.

Graders on one GPU run jobs at once; a few jobs with multi-GiB tensors can exhaust it and
fail every job on the host. Before a job touches the GPU, its grader reserves an estimate
of what the job needs, in whole GiB, and waits while others hold the rest.

The budget is a file whose bytes stand for GiB: holding a POSIX byte-range lock on a byte
holds that GiB. The kernel releases a process's locks when it exits, so a grader that
crashes cannot leak its share. A reservation takes all its bytes or none (no deadlock);
one larger than the whole budget is clamped to it, so it runs alone.

Reservations take turns (an exclusive `flock` on a second file, held while one waits for
its memory): a job that needs 60 GiB waits for what is held to come free, and smaller jobs
arriving meanwhile wait behind it, instead of taking each GiB as it frees and starving it
until its deadline (as GiB programs among small ones were, 8 workers on one H200).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import IO

GIB = 2**30
POLL_S = 0.05
FIRST_POLL_S = 0.001  # the turn is mostly held for microseconds: look again soon, then back off


class BudgetTimeout(Exception):
    """The memory did not come free before the job's deadline."""


class GpuMemoryBudget:
    def __init__(self, path: str, capacity_gib: int) -> None:
        if capacity_gib < 1:
            raise ValueError("a GPU memory budget needs at least 1 GiB")
        self.path = path
        self.turn_path = path + ".turn"
        self.capacity_gib = capacity_gib

    def _take(self, fd: int, want: int) -> list[int]:
        """Lock `want` free bytes, or none; the bytes held."""
        held: list[int] = []
        for byte in random.sample(range(self.capacity_gib), self.capacity_gib):
            if len(held) == want:
                break
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
            except OSError:
                continue
            held.append(byte)
        if len(held) < want:
            self._give(fd, held)
            return []
        return held

    def _take_into(self, fd: int, want: int, held: list[int]) -> bool:
        """`_take`, its bytes added to `held`; whether it got them."""
        held.extend(self._take(fd, want))
        return bool(held)

    @staticmethod
    def _give(fd: int, held: list[int]) -> None:
        for byte in held:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, byte)

    @contextlib.contextmanager
    def reserve(self, gib: int, deadline: float) -> Iterator[int]:
        """Hold `gib` GiB (at least 1, at most the budget) until the block ends."""
        want = min(max(1, gib), self.capacity_gib)
        # One descriptor per reservation: closing any descriptor of the file drops
        # every POSIX lock this process holds on it.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        held: list[int] = []
        try:
            with open(self.turn_path, "ab") as turn:
                self._wait(lambda: _try_flock(turn), want, deadline)  # behind earlier waiters
                try:
                    self._wait(lambda: self._take_into(fd, want, held), want, deadline)
                finally:
                    fcntl.flock(turn, fcntl.LOCK_UN)
            yield want
        finally:
            self._give(fd, held)
            os.close(fd)

    def _wait(self, ready: Callable[[], bool], want: int, deadline: float) -> None:
        """Poll `ready` until it says yes, or raise BudgetTimeout at `deadline`."""
        pause = FIRST_POLL_S
        while not ready():
            if time.monotonic() >= deadline:
                raise BudgetTimeout(
                    f"{want} GiB of GPU memory did not come free in time "
                    f"(budget {self.capacity_gib} GiB shared by all graders)"
                )
            time.sleep(pause * (1 + random.random()))
            pause = min(POLL_S, 2 * pause)


def _try_flock(handle: IO[bytes]) -> bool:
    """Take an exclusive flock without waiting; whether it was free."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def estimate_gib(io_bytes: int, factor: float = 3.0) -> int:
    """GiB a job may need: inputs and outputs on both sides, temporaries, comparisons."""
    return max(1, -(-int(io_bytes * factor) // GIB))
