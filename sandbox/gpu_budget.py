"""A host-wide budget of GPU memory, shared by the grader processes of one sandbox.

Graders on one GPU run jobs at once; a few jobs with multi-GiB tensors can exhaust it and
fail every job on the host. Before a job touches the GPU, its grader reserves an estimate
of what the job needs, in whole GiB, and waits while others hold the rest.

The budget is a file whose bytes stand for GiB: holding a POSIX byte-range lock on a byte
holds that GiB. The kernel releases a process's locks when it exits, so a grader that
crashes cannot leak its share. A reservation takes all its bytes or none (no deadlock);
one larger than the whole budget is clamped to it, so it runs alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import time
from collections.abc import Iterator

GIB = 2**30
POLL_S = 0.05


class BudgetTimeout(Exception):
    """The memory did not come free before the job's deadline."""


class GpuMemoryBudget:
    def __init__(self, path: str, capacity_gib: int) -> None:
        if capacity_gib < 1:
            raise ValueError("a GPU memory budget needs at least 1 GiB")
        self.path = path
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
            while not (held := self._take(fd, want)):
                if time.monotonic() >= deadline:
                    raise BudgetTimeout(
                        f"{want} GiB of GPU memory did not come free in time "
                        f"(budget {self.capacity_gib} GiB shared by all graders)"
                    )
                time.sleep(POLL_S * (1 + random.random()))
            yield want
        finally:
            self._give(fd, held)
            os.close(fd)


def estimate_gib(io_bytes: int, factor: float = 3.0) -> int:
    """GiB a job may need: inputs and outputs on both sides, temporaries, comparisons."""
    return max(1, -(-int(io_bytes * factor) // GIB))
