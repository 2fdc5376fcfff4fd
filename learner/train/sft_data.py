"""SFT data: the teacher's verified pairs, tokenized, split and packed into fixed-length rows.

Input is `drtriton teacher build` output (one JSON line per pair: `program_id`, `level`,
`ops`, `prompt`, `completion`, `verdict`, `problem`, ...). Only pairs the sandbox judged
`correct` are used; the others are counted by verdict. Each example is the prompt's tokens,
the completion's tokens and EOS; the loss falls on the completion and EOS only. Prompt and
completion are tokenized apart, as the policy meets them when it samples (the prompt
encoded alone, the completion generated after it).

Examples are packed several to a row of `seq_len` tokens (`packing.best_fit`, seeded). An
example longer than a row is dropped and counted, or cut to the row when `truncate` is set
(its tail, EOS included, is then never a target). Held-out programs (`data.HeldOut`) are
packed apart and also kept as prompts for pass@1.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, overload

import numpy as np

from sandbox.result import verdict_name

from . import packing
from .data import (
    DataError,
    HeldOut,
    encode,
    eos_id,
    fingerprint,
    open_tokenizer,
    pad_id,
    read_jsonl,
    require,
)
from .loader import BatchIterator
from .prompts import PromptSource, tokenize_prompts

Row = dict[str, np.ndarray]


@dataclass(frozen=True)
class SftPair:
    program_id: str
    level: int | None
    ops: tuple[str, ...]
    prompt: str
    completion: str
    problem: str


@dataclass
class PairCounts:
    """What reading a pairs file kept and why it left the rest out."""

    records: int = 0
    correct: int = 0  # correct pairs kept (after the level filter and dedup)
    not_correct: dict[str, int] = field(default_factory=dict)  # by verdict
    other_level: int = 0
    duplicates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_sft_pairs(
    path: Path | str, *, levels: int | Collection[int] | None = None
) -> tuple[list[SftPair], PairCounts]:
    """The correct pairs of a teacher file (first of each program), in file order."""
    wanted = {levels} if isinstance(levels, int) else None if levels is None else set(levels)
    counts, verdicts, seen = PairCounts(), Counter[str](), set()
    pairs: list[SftPair] = []
    for number, record in read_jsonl(Path(path)):
        where = f"{path}:{number}"
        counts.records += 1
        verdict = _verdict(record, where)
        if verdict != "correct":
            verdicts[verdict] += 1
            continue
        pid = require(record, "program_id", str, where)
        level = record.get("level") if isinstance(record.get("level"), int) else None
        if wanted is not None:
            level = require(record, "level", int, where)
            if level not in wanted:
                counts.other_level += 1
                continue
        fields = [require(record, key, str, where) for key in ("prompt", "completion", "problem")]
        if not fields[0] or not fields[1]:
            raise DataError(f"{where}: empty prompt or completion")
        if pid in seen:
            counts.duplicates += 1
            continue
        seen.add(pid)
        pairs.append(SftPair(pid, level, tuple(record.get("ops") or ()), *fields))
    counts.correct = len(pairs)
    counts.not_correct = dict(verdicts)
    if not pairs:
        raise DataError(f"{path}: no correct pairs to train on ({counts.to_dict()})")
    return pairs, counts


def _verdict(record: dict[str, Any], where: str) -> str:
    """The record's verdict name; older files carry the sandbox enum's number instead."""
    try:
        return verdict_name(record.get("verdict"))
    except ValueError as err:
        raise DataError(f"{where}: `verdict`: {err}") from None


@dataclass
class PackCounts:
    seq_len: int
    examples: int = 0  # packed
    too_long: int = 0  # dropped: longer than a row (or, truncated, no completion left)
    truncated: int = 0
    rows: int = 0
    tokens: int = 0  # non-padding
    loss_tokens: int = 0

    @property
    def fill(self) -> float:
        """The share of row positions that hold tokens rather than padding."""
        return self.tokens / max(1, self.rows * self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fill": round(self.fill, 4)}


class PackedDataset(Sequence[Row]):
    """Packed rows, built on access from one flat token array (see `packing` for the arrays)."""

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        prompt_lengths: Sequence[int],
        program_ids: Sequence[str],
        *,
        seq_len: int,
        seed: int,
        pad: int,
        counts: PackCounts,
    ) -> None:
        self.seq_len = seq_len
        self.pad = pad
        self.program_ids = list(program_ids)
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self._tokens = (
            np.concatenate(sequences).astype(np.int32) if sequences else np.zeros(0, np.int32)
        )
        self._prompt_lengths = np.asarray(prompt_lengths, dtype=np.int64)
        self.rows = [tuple(row) for row in packing.best_fit(lengths, seq_len, seed)]
        counts.examples, counts.rows = len(lengths), len(self.rows)
        counts.tokens = int(lengths.sum())
        counts.loss_tokens = int((lengths - self._prompt_lengths).sum())
        self.counts = counts

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Row: ...
    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...
    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self._row(self.rows[index])

    def _row(self, examples: Sequence[int]) -> Row:
        sequences = [self._tokens[self._starts[e] : self._starts[e + 1]] for e in examples]
        prompts = [int(self._prompt_lengths[e]) for e in examples]
        return packing.pack_row(sequences, prompts, self.seq_len, self.pad)

    def example_ids(self, index: int) -> list[str]:
        """The program ids packed in row `index`, by segment."""
        return [self.program_ids[e] for e in self.rows[index]]

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint(self.seq_len, self.rows, self._tokens, self._prompt_lengths)

    def batches(
        self,
        batch_size: int,
        *,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
        read_threads: int = 0,
    ) -> BatchIterator[Row]:
        """Global batches of `batch_size` rows (this host's share: arrays [B / P, seq_len]),
        epoch-shuffled, forever."""
        if not self.rows:
            raise DataError(f"no packed rows to train on ({self.counts.to_dict()})")
        return BatchIterator(
            self,
            batch_size=batch_size,
            seed=seed,
            fingerprint=self.fingerprint,
            process_index=process_index,
            process_count=process_count,
            read_threads=read_threads,
        )

    def num_eval_batches(self, batch_size: int) -> int:
        return -(-len(self.rows) // batch_size)

    def eval_batches(
        self, batch_size: int, *, process_index: int = 0, process_count: int = 1
    ) -> Iterator[Row]:
        """One pass in row order, every batch full: rows past the end are all padding (no
        loss). Host i of P takes rows i, i + P, ... of each global batch."""
        if batch_size < 1 or batch_size % process_count or not 0 <= process_index < process_count:
            raise DataError(
                f"bad eval batch {batch_size} for process {process_index}/{process_count}"
            )
        for start in range(0, self.num_eval_batches(batch_size) * batch_size, batch_size):
            picks = range(start + process_index, start + batch_size, process_count)
            rows = [self._row(self.rows[i] if i < len(self.rows) else ()) for i in picks]
            yield {key: np.stack([row[key] for row in rows]) for key in packing.ROW_KEYS}


def pack_pairs(
    pairs: Sequence[SftPair],
    tokenizer: Any,
    seq_len: int,
    *,
    seed: int,
    truncate: bool = False,
) -> PackedDataset:
    """Tokenize and pack pairs (prompt + completion + EOS, loss on completion and EOS)."""
    if seq_len < 2:
        raise DataError(f"seq_len must be at least 2, got {seq_len}")
    tokenizer = open_tokenizer(tokenizer)
    eos = np.array([eos_id(tokenizer)], dtype=np.int32)
    prompts = encode(tokenizer, [pair.prompt for pair in pairs])
    completions = encode(tokenizer, [pair.completion for pair in pairs])
    counts = PackCounts(seq_len)
    sequences, prompt_lengths, ids = [], [], []
    for pair, prompt, completion in zip(pairs, prompts, completions, strict=True):
        sequence = np.concatenate([prompt, completion, eos])
        if len(sequence) > seq_len:
            if not truncate or len(prompt) >= seq_len:
                counts.too_long += 1
                continue
            sequence = sequence[:seq_len]
            counts.truncated += 1
        if len(prompt) == 0:
            raise DataError(f"program {pair.program_id}: the prompt encodes to no tokens")
        sequences.append(sequence)
        prompt_lengths.append(len(prompt))
        ids.append(pair.program_id)
    return PackedDataset(
        sequences,
        prompt_lengths,
        ids,
        seq_len=seq_len,
        seed=seed,
        pad=pad_id(tokenizer),
        counts=counts,
    )


@dataclass
class SftData:
    """Train rows, held-out rows (held-out loss) and held-out prompts (pass@1)."""

    train: PackedDataset
    held_out: PackedDataset
    held_out_prompts: PromptSource
    pairs: PairCounts

    def summary(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs.to_dict(),
            "train": self.train.counts.to_dict(),
            "held_out": self.held_out.counts.to_dict(),
            "held_out_prompts": len(self.held_out_prompts),
        }


def load_sft_data(
    path: Path | str,
    tokenizer: Any,
    *,
    seq_len: int,
    seed: int = 0,
    held_out: HeldOut | None = None,
    levels: int | Collection[int] | None = None,
    truncate: bool = False,
) -> SftData:
    """Everything SFT reads from a teacher pairs file; `tokenizer` is a tokenizer or its
    directory. The split is by program id (`HeldOut`, default 5%)."""
    held_out = held_out or HeldOut()
    tokenizer = open_tokenizer(tokenizer)
    pairs, counts = read_sft_pairs(path, levels=levels)
    train = [p for p in pairs if not held_out.contains(p.program_id)]
    kept = [p for p in pairs if held_out.contains(p.program_id)]
    problems = [(p.program_id, p.level, p.ops, p.problem, p.prompt) for p in kept]
    prompts, _ = tokenize_prompts(problems, tokenizer)
    return SftData(
        train=pack_pairs(train, tokenizer, seq_len, seed=seed, truncate=truncate),
        held_out=pack_pairs(kept, tokenizer, seq_len, seed=seed, truncate=truncate),
        held_out_prompts=PromptSource(prompts),
        pairs=counts,
    )
