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

A grader holds two reservations at once: the next job's, and the last one's until its
candidate is dead. POSIX locks belong to the process, so the two must not share bytes (a
byte locked twice by one process is one lock, and unlocking either frees it) nor their
descriptor's close (closing any descriptor of the file drops all the process's locks on it:
a finished job's reaper used to free the next job's whole reservation so). One descriptor
per process and budget file stays open while any of its reservations lives, and the
process's reservations take disjoint bytes (`_ProcessLocks`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

GIB = 2**30
POLL_S = 0.05
FIRST_POLL_S = 0.001  # the turn is mostly held for microseconds: look again soon, then back off


class BudgetTimeout(Exception):
    """The memory did not come free before the job's deadline."""


class _ProcessLocks:
    """This process's POSIX locks on one budget file: one descriptor, open while any of its
    reservations lives, and the bytes they hold (which no other of them may take)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.held: set[int] = set()
        self.users = 0
        self.mutex = threading.Lock()  # a reaper thread gives while the grader takes

    def take(self, capacity: int, want: int) -> list[int]:
        """Lock `want` bytes free on the host and in this process, or none; the bytes."""
        with self.mutex:
            taken: list[int] = []
            for byte in random.sample(range(capacity), capacity):
                if len(taken) == want:
                    break
                if byte in self.held:
                    continue
                try:
                    fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
                except OSError:
                    continue
                taken.append(byte)
                self.held.add(byte)
            if len(taken) < want:
                self._give(taken)
                return []
            return taken

    def give(self, taken: list[int]) -> None:
        with self.mutex:
            self._give(taken)

    def _give(self, taken: list[int]) -> None:
        for byte in taken:
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, byte)
            self.held.discard(byte)


_LOCKS: dict[tuple[int, str], _ProcessLocks] = {}  # by (process, budget file)
_LOCKS_MUTEX = threading.Lock()


@contextlib.contextmanager
def _process_locks(path: str) -> Iterator[_ProcessLocks]:
    """This process's locks on `path`, its descriptor closed once no reservation uses it."""
    key = (os.getpid(), os.path.realpath(path))
    with _LOCKS_MUTEX:
        locks = _LOCKS.get(key)
        if locks is None:
            locks = _LOCKS[key] = _ProcessLocks(path)
        locks.users += 1
    try:
        yield locks
    finally:
        with _LOCKS_MUTEX:
            locks.users -= 1
            if locks.users == 0:
                del _LOCKS[key]
                os.close(locks.fd)  # no lock of this process is left on the file


class GpuMemoryBudget:
    def __init__(self, path: str, capacity_gib: int) -> None:
        if capacity_gib < 1:
            raise ValueError("a GPU memory budget needs at least 1 GiB")
        self.path = path
        self.turn_path = path + ".turn"
        self.capacity_gib = capacity_gib

    @contextlib.contextmanager
    def reserve(self, gib: int, deadline: float) -> Iterator[int]:
        """Hold `gib` GiB (at least 1, at most the budget) until the block ends."""
        want = min(max(1, gib), self.capacity_gib)
        held: list[int] = []

        def take() -> bool:
            held.extend(locks.take(self.capacity_gib, want))
            return bool(held)

        with _process_locks(self.path) as locks:
            try:
                with open(self.turn_path, "ab") as turn:
                    self._wait(lambda: _try_flock(turn), want, deadline)  # behind earlier waiters
                    try:
                        self._wait(take, want, deadline)
                    finally:
                        fcntl.flock(turn, fcntl.LOCK_UN)
                yield want
            finally:
                locks.give(held)

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
