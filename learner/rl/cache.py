"""A bounded cache of sandbox verdicts for identical (problem, candidate) pairs.

A policy that has learned a problem writes the same kernel for it again and again; judging
each copy costs the sandbox seconds. The key is a digest of the problem source, the
candidate source and the request options that change the verdict (trials, timing, seed),
so a hit stands for the same request. Only verdicts on the kernel are kept: a
`sandbox_error` says nothing about it and is asked again next time.

A cached verdict equals a fresh one only when verification is deterministic: on the CPU
sandbox (fixed input seed, no timing) it is; on a GPU the speedup of the same kernel varies
from run to run. The trainer therefore does not checkpoint the cache: a resumed run starts
with an empty one, and its parameters do not depend on which answers came from it.

Thread-safe: the verifier thread fills it while the learner thread reads its counters.
"""

from __future__ import annotations

import hashlib
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
    """Least-recently-used map from `cache_key` to a verdict record; `capacity` 0 = off."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("cache capacity must be >= 0")
        self.capacity = capacity
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict[str, Any] | None:
        """A copy of the cached record, or None (counted as a miss)."""
        with self._lock:
            record = self._entries.get(key)
            if record is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return dict(record)

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Keep a judged verdict (unjudged ones are ignored); the oldest goes past capacity."""
        if self.capacity == 0 or record.get("verdict") in UNJUDGED_VERDICTS:
            return
        with self._lock:
            self._entries[key] = dict(record)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
