"""Packing as pure functions: where examples go and what each row array holds."""

from __future__ import annotations

import numpy as np
import pytest

from learner.train.packing import best_fit, pack_row


def test_best_fit_places_every_example_once_within_capacity() -> None:
    lengths = np.random.default_rng(0).integers(1, 60, size=300)
    rows = best_fit(lengths, 100, seed=3)
    placed = sorted(i for row in rows for i in row)
    assert placed == list(range(300))
    assert all(sum(lengths[i] for i in row) <= 100 for row in rows)
    # best fit packs tightly: at most one more row than a perfect packing would need
    assert len(rows) <= -(-int(lengths.sum()) // 100) + 2


def test_best_fit_is_a_function_of_lengths_capacity_and_seed() -> None:
    lengths = np.random.default_rng(1).integers(1, 60, size=100)
    assert best_fit(lengths, 100, seed=5) == best_fit(lengths.tolist(), 100, seed=5)
    assert best_fit(lengths, 100, seed=5) != best_fit(lengths, 100, seed=6)


def test_best_fit_rejects_an_example_longer_than_a_row() -> None:
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        best_fit([3, 9], 8, seed=0)


def test_pack_row_arrays() -> None:
    # example 1: prompt [10, 11], completion [12, 13], EOS 2; example 2: prompt [20], completion
    # [21], EOS 2; then two padding positions (pad 0)
    row = pack_row(
        [np.array([10, 11, 12, 13, 2]), np.array([20, 21, 2])], [2, 1], seq_len=10, pad=0
    )
    assert row["tokens"].tolist() == [10, 11, 12, 13, 2, 20, 21, 2, 0, 0]
    assert row["targets"].tolist() == [11, 12, 13, 2, 0, 21, 2, 0, 0, 0]
    # loss where the target is a completion token or EOS: 12, 13, 2 and 21, 2
    assert row["loss_mask"].tolist() == [0, 1, 1, 1, 0, 1, 1, 0, 0, 0]
    assert row["segment_ids"].tolist() == [1, 1, 1, 1, 1, 2, 2, 2, 0, 0]
    assert row["positions"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0]
    assert {k: v.dtype for k, v in row.items()} == {
        "tokens": np.int32,
        "targets": np.int32,
        "loss_mask": np.float32,
        "segment_ids": np.int32,
        "positions": np.int32,
    }


def test_pack_row_without_examples_is_all_padding() -> None:
    row = pack_row([], [], seq_len=4, pad=7)
    assert row["tokens"].tolist() == [7] * 4
    assert not row["loss_mask"].any() and not row["segment_ids"].any()


def test_pack_row_refuses_what_does_not_fit() -> None:
    with pytest.raises(ValueError):
        pack_row([np.arange(6), np.arange(5)], [1, 1], seq_len=10, pad=0)
    with pytest.raises(ValueError):  # no prompt token: the first target has no context
        pack_row([np.arange(4)], [0], seq_len=10, pad=0)
