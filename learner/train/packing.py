"""Packing variable-length examples into fixed-length rows (pure functions of arrays).

Examples go into rows by best fit in a seeded shuffled order: each example, taken in the
order of `numpy.random.default_rng(seed).permutation`, goes into the open row with the
least room that still holds it, or starts a new row. The result depends on (lengths,
capacity, seed) only. Inside a row examples keep the order they were placed in.

A row's arrays, for examples e1, e2, ... placed one after another:
- `tokens[t]`: the token at t; padding after the last example.
- `targets[t]`: the next token of the same example (`tokens[t + 1]`); padding at each
  example's last token, whose successor belongs to another example or to nothing.
- `loss_mask[t]` (float32, 0 or 1): 1 where `targets[t]` is a completion token or the
  closing EOS, so the prompt is never a loss target.
- `segment_ids[t]`: 1, 2, 3, ... for the examples of the row, 0 for padding; attention
  stays inside a segment.
- `positions[t]`: the position inside the example, from 0 at each example's start.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

ROW_KEYS = ("tokens", "targets", "loss_mask", "segment_ids", "positions")


def best_fit(lengths: Sequence[int], capacity: int, seed: int) -> list[list[int]]:
    """Rows of example indices; every length must be in [1, capacity]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > capacity):
        raise ValueError(f"every length must be in [1, {capacity}]")
    smallest = int(lengths.min()) if lengths.size else 1
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, row), sorted; rows that fit no example leave
    for index in np.random.default_rng(seed).permutation(lengths.size).tolist():
        need = int(lengths[index])
        at = bisect.bisect_left(room, (need, -1))
        if at < len(room):
            free, row = room.pop(at)
        else:
            free, row = capacity, len(rows)
            rows.append([])
        rows[row].append(index)
        if free - need >= smallest:
            bisect.insort(room, (free - need, row))
    return rows


def pack_row(
    sequences: Sequence[np.ndarray], prompt_lengths: Sequence[int], seq_len: int, pad: int
) -> dict[str, np.ndarray]:
    """One row's arrays (see the module docstring); no sequences gives an all-padding row.

    Each sequence is prompt + completion (+ EOS), with its prompt at least one token long.
    """
    tokens = np.full(seq_len, pad, dtype=np.int32)
    targets = np.full(seq_len, pad, dtype=np.int32)
    loss_mask = np.zeros(seq_len, dtype=np.float32)
    segment_ids = np.zeros(seq_len, dtype=np.int32)
    positions = np.zeros(seq_len, dtype=np.int32)
    at = 0
    for segment, (sequence, prompt) in enumerate(zip(sequences, prompt_lengths, strict=True), 1):
        n = len(sequence)
        if not 1 <= prompt < n or at + n > seq_len:
            raise ValueError(
                f"segment {segment}: length {n}, prompt {prompt}, row room {seq_len - at}"
            )
        tokens[at : at + n] = sequence
        targets[at : at + n - 1] = sequence[1:]
        loss_mask[at + prompt - 1 : at + n - 1] = 1.0
        segment_ids[at : at + n] = segment
        positions[at : at + n] = np.arange(n, dtype=np.int32)
        at += n
    return {
        "tokens": tokens,
        "targets": targets,
        "loss_mask": loss_mask,
        "segment_ids": segment_ids,
        "positions": positions,
    }
