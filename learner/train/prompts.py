"""RL and evaluation prompts: one record per program, its prompt built by the teacher's
`build_prompt` (the one definition of the prompt format) and tokenized once.

Reads program files written by `drtriton synth generate` (fields `id`, `level`, `ops`,
`source`); ids are the teacher's (`synth.teacher.build.program_id`), so the held-out
split agrees with the one of the SFT pairs made from the same programs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, overload

from synth.teacher.build import program_id as teacher_program_id
from synth.teacher.prompt import build_prompt

from .data import (
    DataError,
    HeldOut,
    Split,
    encode,
    fingerprint,
    open_tokenizer,
    read_jsonl,
    require,
)
from .loader import BatchIterator


@dataclass(frozen=True)
class PromptRecord:
    """One problem as the policy sees it, with what the sandbox needs to judge an answer."""

    program_id: str
    level: int | None
    problem_source: str
    prompt_text: str
    prompt_tokens: tuple[int, ...]
    ops: tuple[str, ...] = ()


@dataclass
class PromptCounts:
    """What reading the programs kept and why it left the rest out."""

    records: int = 0
    kept: int = 0
    other_level: int = 0
    other_split: int = 0
    duplicates: int = 0
    too_long: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def tokenize_prompts(
    problems: Sequence[tuple[str, int | None, tuple[str, ...], str, str]],
    tokenizer: Any,
    max_prompt_tokens: int | None = None,
) -> tuple[list[PromptRecord], int]:
    """PromptRecords of (program_id, level, ops, problem_source, prompt_text) tuples, and how
    many were dropped for a prompt longer than `max_prompt_tokens`."""
    tokens = encode(tokenizer, [problem[4] for problem in problems])
    records, too_long = [], 0
    for (pid, level, ops, source, text), ids in zip(problems, tokens, strict=True):
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            too_long += 1
            continue
        records.append(PromptRecord(pid, level, source, text, tuple(ids.tolist()), ops))
    return records, too_long


class PromptSource(Sequence[PromptRecord]):
    """Prompts in file order (first occurrence of each program), batched by `batches`."""

    def __init__(self, prompts: Iterable[PromptRecord], counts: PromptCounts | None = None):
        self.prompts = list(prompts)
        self.counts = counts or PromptCounts(records=len(self.prompts), kept=len(self.prompts))

    @classmethod
    def from_programs(
        cls,
        paths: Path | str | Sequence[Path | str],
        tokenizer: Any,
        *,
        levels: int | Collection[int] | None = None,
        split: Split = "train",
        held_out: HeldOut | None = None,
        with_example: bool = False,
        max_prompt_tokens: int | None = None,
    ) -> PromptSource:
        """Programs of the given levels (all when None) in `split` (`HeldOut`, default 5%);
        `tokenizer` is a tokenizer or its directory."""
        tokenizer = open_tokenizer(tokenizer)
        held_out = held_out or HeldOut()
        wanted = {levels} if isinstance(levels, int) else None if levels is None else set(levels)
        counts, seen = PromptCounts(), set()
        problems: list[tuple[str, int | None, tuple[str, ...], str, str]] = []
        for path in [paths] if isinstance(paths, str | Path) else paths:
            for number, record in read_jsonl(Path(path)):
                where = f"{path}:{number}"
                source = require(record, "source", str, where)
                level = require(record, "level", int, where)
                pid = teacher_program_id(record)
                counts.records += 1
                if wanted is not None and level not in wanted:
                    counts.other_level += 1
                elif not held_out.keeps(pid, split):
                    counts.other_split += 1
                elif pid in seen:
                    counts.duplicates += 1
                else:
                    seen.add(pid)
                    text = build_prompt(source, with_example=with_example)
                    problems.append((pid, level, tuple(record.get("ops") or ()), source, text))
        prompts, counts.too_long = tokenize_prompts(problems, tokenizer, max_prompt_tokens)
        counts.kept = len(prompts)
        return cls(prompts, counts)

    def __len__(self) -> int:
        return len(self.prompts)

    @overload
    def __getitem__(self, index: int) -> PromptRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[PromptRecord]: ...
    def __getitem__(self, index: int | slice) -> PromptRecord | list[PromptRecord]:
        return self.prompts[index]

    @property
    def levels(self) -> list[int]:
        return sorted({p.level for p in self.prompts if p.level is not None})

    def at_levels(self, levels: int | Collection[int]) -> PromptSource:
        """The prompts of some levels only (a curriculum stage), without reading again."""
        wanted = {levels} if isinstance(levels, int) else set(levels)
        return PromptSource([p for p in self.prompts if p.level in wanted])

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint([[p.program_id, len(p.prompt_tokens)] for p in self.prompts])

    def batches(
        self,
        batch_size: int,
        *,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> BatchIterator[list[PromptRecord]]:
        """Lists of `batch_size // process_count` prompts, epoch-shuffled, forever."""
        if not self.prompts:
            raise DataError(f"no prompts to train on ({self.counts.to_dict()})")
        return BatchIterator(
            self.prompts,
            batch_size=batch_size,
            seed=seed,
            fingerprint=self.fingerprint,
            process_index=process_index,
            process_count=process_count,
            batch_fn=list,
        )
