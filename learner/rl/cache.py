"""A bounded cache of sandbox verdicts for identical (problem, candidate) pairs.

A policy that has learned a problem writes the same kernel for it again and again; judging
each copy costs the sandbox seconds. The key is a digest of the problem source, the
candidate source and the request options that change the verdict (trials, timing, seed),
so a hit stands for the same request. Only verdicts on the kernel are kept: a
`sandbox_error` says nothing about it and is asked again next time.

A cached verdict equals a fresh one only when verification is deterministic: on the CPU
sandbox (fixed input seed, no timing) it is; on a GPU the speedup of the same kernel varies
from run to run. So a timed verdict is not served until the kernel has been timed
`timings_per_kernel` times: until then a lookup misses (a `retime`) and each new figure
joins the entry, which then holds the median speedup. One lucky (or unlucky) measurement
does not stick to a kernel the policy writes again and again. A new verdict that differs
from the kept one (a near-tolerance output judged the other way) replaces it.
The trainer does not checkpoint the cache: a resumed run starts with an empty one, and
its parameters do not depend on which answers came from it.

Thread-safe: the verifier thread fills it while the learner thread reads its counters.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from learner.rl.rewards import UNJUDGED_VERDICTS


def cache_key(problem: str, candidate: str, options: Mapping[str, Any]) -> str:
    """A digest naming one verification request (sources and the options that matter)."""
    digest = hashlib.sha256()
    for part in (problem, candidate, repr(sorted(options.items()))):
        data = part.encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


class VerdictCache:
    """Least-recently-used map from `cache_key` to a verdict record; `capacity` 0 = off.
    A timed record is served once `timings_per_kernel` speedups of it are in (their median)."""

    def __init__(self, capacity: int, timings_per_kernel: int = 3) -> None:
        if capacity < 0:
            raise ValueError("cache capacity must be >= 0")
        if timings_per_kernel < 1:
            raise ValueError("timings per kernel must be at least 1")
        self.capacity = capacity
        self.timings_per_kernel = timings_per_kernel
        # key -> (the record to serve, the speedups measured for it)
        self._entries: OrderedDict[str, tuple[dict[str, Any], list[float]]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.retimes = 0  # misses of a kernel judged before, asked again for its timing

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict[str, Any] | None:
        """A copy of the cached record, or None (counted as a miss)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and 0 < len(entry[1]) < self.timings_per_kernel:
                self.retimes += 1
                entry = None
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return dict(entry[0])

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Keep a judged verdict (unjudged ones are ignored); the oldest goes past capacity.
        A timed verdict like the kept one adds its speedup to it."""
        if self.capacity == 0 or record.get("verdict") in UNJUDGED_VERDICTS:
            return
        speedup = record.get("speedup_vs_eager")
        with self._lock:
            kept = self._entries.get(key)
            timings: list[float] = []
            if kept is not None and kept[0].get("verdict") == record.get("verdict"):
                timings = kept[1]
            stored = dict(record)
            if speedup is not None:
                timings = [*timings, float(speedup)]
            if timings:  # (a correct verdict left untimed this time keeps the earlier figures)
                stored["speedup_vs_eager"] = statistics.median(timings)
            self._entries[key] = (stored, timings)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
