"""SFT data from teacher pairs: filtering, tokenizing, packing, the held-out split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from learner.tokenizer import EOS
from learner.train.data import DataError, HeldOut
from learner.train.sft_data import load_sft_data, pack_pairs, read_sft_pairs

from .conftest import pair_record, write_jsonl

SEQ_LEN = 512


def ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_only_correct_pairs_are_kept_and_the_others_counted(pairs_file: Path) -> None:
    pairs, counts = read_sft_pairs(pairs_file)
    assert len(pairs) == counts.correct == 37
    assert counts.not_correct == {"incorrect": 2, "compile_error": 1}
    assert "prog0003" not in {p.program_id for p in pairs}


def test_levels_filter_and_duplicates(tmp_path: Path) -> None:
    records = [pair_record(i) for i in range(6)] + [pair_record(2)]
    pairs, counts = read_sft_pairs(write_jsonl(tmp_path / "p.jsonl", records), levels=2)
    assert [p.level for p in pairs] == [2, 2, 2]
    assert counts.other_level == 4  # prog0002's second line is filtered before dedup
    pairs, counts = read_sft_pairs(write_jsonl(tmp_path / "p.jsonl", records))
    assert counts.duplicates == 1 and len(pairs) == 6


def test_rows_hold_prompt_completion_and_eos_with_loss_on_the_completion_only(
    pairs_file: Path, tokenizer: Any
) -> None:
    pairs, _ = read_sft_pairs(pairs_file)
    data = pack_pairs(pairs, tokenizer, SEQ_LEN, seed=0)
    by_id = {p.program_id: p for p in pairs}
    eos = tokenizer.eos_token_id
    assert data.counts.examples == len(pairs) and data.counts.too_long == 0
    assert len(data) < len(pairs)  # several examples share a row
    seen = []
    for index in range(len(data)):
        row = data[index]
        assert all(v.shape == (SEQ_LEN,) for v in row.values())
        for segment, pid in enumerate(data.example_ids(index), 1):
            pair = by_id[pid]
            at = row["segment_ids"] == segment
            prompt, completion = ids(tokenizer, pair.prompt), ids(tokenizer, pair.completion)
            assert row["tokens"][at].tolist() == prompt + completion + [eos]
            assert row["positions"][at].tolist() == list(range(at.sum()))
            loss = at & (row["loss_mask"] == 1)
            assert loss.sum() == len(completion) + 1
            assert tokenizer.decode(row["targets"][loss]) == pair.completion + EOS
            seen.append(pid)
        padding = row["segment_ids"] == 0
        assert not row["loss_mask"][padding].any()
        assert row["segment_ids"][~padding].min() == 1
    assert sorted(seen) == sorted(by_id)
    assert data.counts.loss_tokens == sum(data[i]["loss_mask"].sum() for i in range(len(data)))


def test_long_examples_are_dropped_or_truncated(pairs_file: Path, tokenizer: Any) -> None:
    pairs, _ = read_sft_pairs(pairs_file)
    lengths = [len(ids(tokenizer, p.prompt)) + len(ids(tokenizer, p.completion)) + 1 for p in pairs]
    seq_len = int(np.median(lengths))
    longer = sum(n > seq_len for n in lengths)
    dropped = pack_pairs(pairs, tokenizer, seq_len, seed=0)
    assert dropped.counts.too_long == longer and dropped.counts.examples == len(pairs) - longer
    cut = pack_pairs(pairs, tokenizer, seq_len, seed=0, truncate=True)
    assert cut.counts.truncated == longer and cut.counts.examples == len(pairs)
    full = [cut[i] for i in range(len(cut)) if cut[i]["segment_ids"].max() == 1]
    assert any(row["segment_ids"].all() and row["loss_mask"][-1] == 0 for row in full)


def test_packing_is_deterministic(pairs_file: Path, tokenizer: Any) -> None:
    first = load_sft_data(pairs_file, tokenizer, seq_len=SEQ_LEN, seed=4)
    again = load_sft_data(pairs_file, tokenizer, seq_len=SEQ_LEN, seed=4)
    other = load_sft_data(pairs_file, tokenizer, seq_len=SEQ_LEN, seed=5)
    assert first.train.rows == again.train.rows
    assert first.train.fingerprint == again.train.fingerprint
    for i in range(len(first.train)):
        for key, value in first.train[i].items():
            np.testing.assert_array_equal(value, again.train[i][key])
    assert first.train.rows != other.train.rows
    assert first.train.fingerprint != other.train.fingerprint


def test_held_out_split_is_disjoint_stable_and_ready_for_pass_at_1(
    tmp_path: Path, tokenizer: Any, tokenizer_dir: Path
) -> None:
    records = [pair_record(i) for i in range(200)]
    forward = write_jsonl(tmp_path / "a.jsonl", records)
    backward = write_jsonl(tmp_path / "b.jsonl", records[::-1])
    split = HeldOut(fraction=0.2)
    data = load_sft_data(forward, tokenizer_dir, seq_len=SEQ_LEN, held_out=split)
    train = {pid for i in range(len(data.train)) for pid in data.train.example_ids(i)}
    held = {pid for i in range(len(data.held_out)) for pid in data.held_out.example_ids(i)}
    assert train and held and not train & held and len(train | held) == 200
    assert 20 <= len(held) <= 60
    assert {p.program_id for p in data.held_out_prompts} == held
    reordered = load_sft_data(backward, tokenizer_dir, seq_len=SEQ_LEN, held_out=split)
    assert {p.program_id for p in reordered.held_out_prompts} == held
    prompt = data.held_out_prompts[0]
    record = next(r for r in records if r["program_id"] == prompt.program_id)
    assert prompt.problem_source == record["problem"] and prompt.prompt_text == record["prompt"]
    assert list(prompt.prompt_tokens) == ids(tokenizer, record["prompt"])
    other = load_sft_data(forward, tokenizer_dir, seq_len=SEQ_LEN, held_out=HeldOut(0.2, "x"))
    assert {p.program_id for p in other.held_out_prompts} != held


def test_eval_batches_cover_every_row_once_with_padding_rows(
    pairs_file: Path, tokenizer: Any
) -> None:
    pairs, _ = read_sft_pairs(pairs_file)
    data = pack_pairs(pairs, tokenizer, SEQ_LEN, seed=0)
    batches = list(data.eval_batches(4))
    assert len(batches) == data.num_eval_batches(4) == -(-len(data) // 4)
    tokens = np.concatenate([b["tokens"] for b in batches])
    expected = np.stack([data[i]["tokens"] for i in range(len(data))])
    np.testing.assert_array_equal(tokens[: len(data)], expected)
    assert not np.concatenate([b["loss_mask"] for b in batches])[len(data) :].any()
    halves = [list(data.eval_batches(4, process_index=i, process_count=2)) for i in (0, 1)]
    for k, batch in enumerate(batches):
        np.testing.assert_array_equal(halves[0][k]["tokens"], batch["tokens"][0::2])
        np.testing.assert_array_equal(halves[1][k]["tokens"], batch["tokens"][1::2])


def test_no_correct_pairs_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "p.jsonl", [pair_record(i, verdict="incorrect") for i in range(3)]
    )
    with pytest.raises(DataError, match=r"p\.jsonl: no correct pairs.*'incorrect': 3"):
        read_sft_pairs(path)


def test_a_pair_without_its_fields_names_the_line(tmp_path: Path) -> None:
    record = pair_record(1)
    del record["completion"]
    path = write_jsonl(tmp_path / "p.jsonl", [pair_record(0), record])
    with pytest.raises(DataError, match=r"p\.jsonl:2: `completion` must be a string"):
        read_sft_pairs(path)
    with pytest.raises(DataError, match=r"p\.jsonl:1: `level` must be an integer"):
        read_sft_pairs(write_jsonl(path, [pair_record(0) | {"level": None}]), levels=1)
