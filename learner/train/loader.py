"""Infinite, epoch-shuffled global batches whose position is exact and checkpointable.

Built on grain's `MapDataset`: `shuffle(seed).repeat()` permutes every epoch anew (epoch e
with seed + e) by index arithmetic, so batch k is a pure function of (items, seed, k) and
the iterator's position is one integer. Hosts of a multi-host run all walk the same
global stream: host i of P takes elements i, i + P, i + 2P, ... of it, so its k-th batch
is its share of global batch k, and every host steps in lockstep.

`get_state()` is a small JSON-able dict (it goes into a checkpoint as JSON); `set_state`
checks it was taken over the same data, seed and batch shape, then resumes exactly where
it stood: the batches that follow equal those of a run that never stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import grain

from .data import DataError

T = TypeVar("T")
B = TypeVar("B")

STATE_VERSION = 1


class BatchIterator(Generic[B]):
    """Batches of `batch_size // process_count` items for this host, forever.

    `batch_fn` turns a list of items into a batch (default: grain's, which stacks arrays
    leaf by leaf); `read_threads` > 0 builds batches ahead in threads (the position stays
    exact: it counts batches handed out, not batches built).
    """

    def __init__(
        self,
        items: Sequence[T],
        *,
        batch_size: int,
        seed: int,
        fingerprint: str,
        process_index: int = 0,
        process_count: int = 1,
        batch_fn: Callable[[Sequence[T]], B] | None = None,
        read_threads: int = 0,
    ) -> None:
        if len(items) == 0:
            raise DataError("no items to batch")
        if batch_size < 1 or process_count < 1 or batch_size % process_count:
            raise DataError(
                f"batch_size {batch_size} must be a positive multiple of process_count "
                f"{process_count}"
            )
        if not 0 <= process_index < process_count:
            raise DataError(f"process_index {process_index} not in [0, {process_count})")
        if not 0 <= seed < 2**32:
            raise DataError(f"seed must be in [0, 2**32), got {seed}")
        self.batch_size = batch_size
        self.local_batch_size = batch_size // process_count
        self.seed = seed
        self.fingerprint = fingerprint
        self.process_index = process_index
        self.process_count = process_count
        self.num_items = len(items)
        # Forever in practice, but a finite length: grain's iterator takes len() of the
        # batched dataset, and an endless one batched by 1 overflows an index.
        epochs = max(1, 2**62 // len(items))
        dataset = grain.MapDataset.source(items).shuffle(seed=seed).repeat(num_epochs=epochs)
        if process_count > 1:
            dataset = dataset[process_index::process_count]
        dataset = dataset.batch(self.local_batch_size, batch_fn=batch_fn)
        options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=2 * read_threads)
        self._batches = dataset.to_iter_dataset(options).__iter__()
        self.step = 0

    def __iter__(self) -> Iterator[B]:
        return self

    def __next__(self) -> B:
        batch = self._batches.__next__()
        self.step += 1
        return batch

    @property
    def epoch(self) -> float:
        """Passes over the data so far (fractional)."""
        return self.step * self.batch_size / self.num_items

    def get_state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "process_count": self.process_count,
            "num_items": self.num_items,
            "fingerprint": self.fingerprint,
            "grain": self._batches.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; a state of other data or settings is a `DataError`."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise DataError(f"not a data position of this loader (version {STATE_VERSION})")
        mine = self.get_state()
        for key in ("seed", "batch_size", "process_count", "num_items", "fingerprint"):
            if state.get(key) != mine[key]:
                raise DataError(
                    f"the saved data position is for {key}={state.get(key)!r}, this run has "
                    f"{mine[key]!r}: the data or its settings changed since the checkpoint"
                )
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise DataError(f"bad step in the saved data position: {step!r}")
        self._batches.set_state(state["grain"])
        self.step = step
