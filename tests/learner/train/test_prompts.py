"""RL prompts from program files: levels, the shared held-out split, batching."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from learner.train.data import DataError, HeldOut
from learner.train.prompts import PromptSource
from learner.train.sft_data import load_sft_data
from synth.teacher.prompt import build_prompt

from .conftest import pair_record, program_record, write_jsonl


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    records = [program_record(i, level=1 + i % 3) for i in range(60)]
    return write_jsonl(tmp_path / "programs.jsonl", records)


def test_prompts_are_the_teacher_prompt_tokenized(programs: Path, tokenizer: Any) -> None:
    source = PromptSource.from_programs(programs, tokenizer, split="all")
    assert len(source) == 60 and source.counts.kept == 60
    prompt = source[4]
    assert (prompt.program_id, prompt.level, prompt.ops) == ("prog0004", 2, ("abs",))
    assert prompt.problem_source == json.loads(programs.read_text().splitlines()[4])["source"]
    assert prompt.prompt_text == build_prompt(prompt.problem_source)
    expected = tokenizer(prompt.prompt_text, add_special_tokens=False)["input_ids"]
    assert list(prompt.prompt_tokens) == expected


def test_levels_filter(programs: Path, tokenizer: Any) -> None:
    level_2 = PromptSource.from_programs(programs, tokenizer, levels=2, split="all")
    assert len(level_2) == 20 and level_2.levels == [2]
    assert level_2.counts.other_level == 40
    some = PromptSource.from_programs(programs, tokenizer, levels=[1, 3], split="all")
    assert some.levels == [1, 3] and len(some) == 40
    assert [p.program_id for p in some.at_levels(3)] == [
        p.program_id for p in PromptSource.from_programs(programs, tokenizer, levels=3, split="all")
    ]


def test_held_out_split_matches_the_sft_split(
    programs: Path, tmp_path: Path, tokenizer: Any
) -> None:
    split = HeldOut(fraction=0.3)
    train = PromptSource.from_programs(programs, tokenizer, held_out=split)
    held = PromptSource.from_programs(programs, tokenizer, split="held_out", held_out=split)
    train_ids, held_ids = {p.program_id for p in train}, {p.program_id for p in held}
    assert train_ids and held_ids and not train_ids & held_ids
    assert len(train_ids | held_ids) == 60
    assert held.counts.other_split == len(train_ids)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [pair_record(i) for i in range(60)])
    sft = load_sft_data(pairs, tokenizer, seq_len=512, held_out=split)
    assert {p.program_id for p in sft.held_out_prompts} == held_ids


def test_duplicates_and_long_prompts_are_counted(tmp_path: Path, tokenizer: Any) -> None:
    records = [program_record(i, level=1) for i in range(5)] + [program_record(2, level=1)]
    path = write_jsonl(tmp_path / "programs.jsonl", records)
    source = PromptSource.from_programs(path, tokenizer, split="all")
    assert len(source) == 5 and source.counts.duplicates == 1
    lengths = sorted(len(p.prompt_tokens) for p in source)
    short = PromptSource.from_programs(path, tokenizer, split="all", max_prompt_tokens=lengths[2])
    assert short.counts.too_long == sum(n > lengths[2] for n in lengths)
    assert all(len(p.prompt_tokens) <= lengths[2] for p in short)


def test_prompt_batches_resume_exactly(programs: Path, tokenizer: Any) -> None:
    source = PromptSource.from_programs(programs, tokenizer, levels=1, split="all")
    reference = [next(b) for b in [source.batches(8, seed=0)] for _ in range(6)]
    assert all(len(batch) == 8 for batch in reference)
    first = source.batches(8, seed=0)
    for _ in range(3):
        next(first)
    state = json.loads(json.dumps(first.get_state()))
    resumed = source.batches(8, seed=0)
    resumed.set_state(state)
    assert [next(resumed) for _ in range(3)] == reference[3:]


def test_prompt_errors(tmp_path: Path, tokenizer: Any) -> None:
    record = program_record(0, level=1)
    del record["level"]
    path = write_jsonl(tmp_path / "programs.jsonl", [program_record(1, level=1), record])
    with pytest.raises(DataError, match=r"programs\.jsonl:2: `level` must be an integer"):
        PromptSource.from_programs(path, tokenizer)
    empty = PromptSource.from_programs(
        write_jsonl(path, [program_record(1, level=1)]), tokenizer, levels=5
    )
    with pytest.raises(DataError, match="no prompts to train on.*'other_level': 1"):
        empty.batches(2, seed=0)
