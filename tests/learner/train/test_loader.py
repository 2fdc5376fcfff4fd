"""The batch iterator: epoch shuffling, host shares, and an exact JSON position."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from learner.train.data import DataError
from learner.train.loader import BatchIterator
from learner.train.sft_data import load_sft_data

from .conftest import pair_record, write_jsonl


def items(n: int) -> list[dict[str, np.ndarray]]:
    return [{"x": np.array([i, -i], dtype=np.int32)} for i in range(n)]


def take(iterator: Any, count: int) -> list[Any]:
    return [next(iterator) for _ in range(count)]


def ids_of(batch: dict[str, np.ndarray]) -> list[int]:
    return batch["x"][:, 0].tolist()


def test_each_epoch_is_a_fresh_permutation() -> None:
    loader = BatchIterator(items(12), batch_size=4, seed=7, fingerprint="f")
    epochs = [sum((ids_of(b) for b in take(loader, 3)), []) for _ in range(3)]
    assert all(sorted(epoch) == list(range(12)) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3
    assert loader.step == 9 and loader.epoch == 3.0
    again = BatchIterator(items(12), batch_size=4, seed=7, fingerprint="f")
    assert sum((ids_of(b) for b in take(again, 9)), []) == sum(epochs, [])


@pytest.mark.parametrize("read_threads", [0, 2])
def test_restored_position_yields_exactly_the_uninterrupted_batches(read_threads: int) -> None:
    def make() -> BatchIterator:
        return BatchIterator(
            items(10), batch_size=4, seed=3, fingerprint="f", read_threads=read_threads
        )

    straight = make()
    reference = take(straight, 12)  # crosses several epoch boundaries (10 items, 4 a batch)
    first = make()
    take(first, 5)
    saved = json.loads(json.dumps(first.get_state()))
    resumed = make()
    resumed.set_state(saved)
    assert resumed.step == 5
    for got, want in zip(take(resumed, 7), reference[5:], strict=True):
        np.testing.assert_array_equal(got["x"], want["x"])


def test_packed_rows_resume_exactly(tmp_path: Path, tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "pairs.jsonl", [pair_record(i) for i in range(30)])
    rows = load_sft_data(path, tokenizer, seq_len=512, seed=1).train
    reference = take(rows.batches(3, seed=2), 9)
    first = rows.batches(3, seed=2)
    take(first, 4)
    state = json.dumps(first.get_state())
    assert len(state) < 1000
    # a fresh process would rebuild the data from the file: do the same
    fresh = load_sft_data(path, tokenizer, seq_len=512, seed=1).train.batches(3, seed=2)
    fresh.set_state(json.loads(state))
    for got, want in zip(take(fresh, 5), reference[4:], strict=True):
        assert got.keys() == want.keys() and got["tokens"].shape == (3, 512)
        for key in got:
            np.testing.assert_array_equal(got[key], want[key])


def test_hosts_share_each_global_batch() -> None:
    whole = take(BatchIterator(items(9), batch_size=4, seed=1, fingerprint="f"), 6)
    shares = [
        take(
            BatchIterator(
                items(9), batch_size=4, seed=1, fingerprint="f", process_index=i, process_count=2
            ),
            6,
        )
        for i in (0, 1)
    ]
    for k, batch in enumerate(whole):
        assert ids_of(shares[0][k]) == ids_of(batch)[0::2]
        assert ids_of(shares[1][k]) == ids_of(batch)[1::2]


def test_a_position_from_other_data_or_settings_is_refused() -> None:
    loader = BatchIterator(items(10), batch_size=4, seed=3, fingerprint="f")
    next(loader)
    state = loader.get_state()
    for changed in (
        BatchIterator(items(10), batch_size=4, seed=4, fingerprint="f"),
        BatchIterator(items(10), batch_size=2, seed=3, fingerprint="f"),
        BatchIterator(items(10), batch_size=4, seed=3, fingerprint="g"),
        BatchIterator(items(11), batch_size=4, seed=3, fingerprint="f"),
    ):
        with pytest.raises(DataError, match="changed since the checkpoint"):
            changed.set_state(state)
    with pytest.raises(DataError, match="not a data position"):
        loader.set_state({"next_index": 3})


def test_bad_batch_settings_are_refused() -> None:
    with pytest.raises(DataError, match="no items"):
        BatchIterator([], batch_size=2, seed=0, fingerprint="f")
    with pytest.raises(DataError, match="multiple of process_count 2"):
        BatchIterator(items(4), batch_size=3, seed=0, fingerprint="f", process_count=2)
    with pytest.raises(DataError, match="process_index 2"):
        BatchIterator(
            items(4), batch_size=2, seed=0, fingerprint="f", process_index=2, process_count=2
        )


def test_a_batch_of_one_item_is_a_batch() -> None:
    """One prompt a step (a small RL run) or one row a step: batches of one, resumable."""
    loader = BatchIterator(items(5), batch_size=1, seed=3, fingerprint="f")
    first = [ids_of(b)[0] for b in take(loader, 4)]
    saved = json.loads(json.dumps(loader.get_state()))
    rest = [ids_of(b)[0] for b in take(loader, 6)]
    assert sorted(first + rest[:1]) == sorted(rest[1:]) == list(range(5))  # two epochs
    resumed = BatchIterator(items(5), batch_size=1, seed=3, fingerprint="f")
    resumed.set_state(saved)
    assert [ids_of(b)[0] for b in take(resumed, 6)] == rest
