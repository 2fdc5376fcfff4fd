"""Shared data plumbing: clear errors for bad inputs, the split, and no torch/triton."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from learner.train.data import DataError, HeldOut, open_tokenizer, read_jsonl
from learner.train.prompts import PromptSource
from learner.train.sft_data import load_sft_data

from .conftest import pair_record, write_jsonl

REPO = Path(__file__).resolve().parents[3]


def test_missing_empty_and_malformed_files(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        load_sft_data(tmp_path / "nope.jsonl", tokenizer, seq_len=64)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: empty file"):
        PromptSource.from_programs(tmp_path / "empty.jsonl", tokenizer)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3: not JSON"):
        list(read_jsonl(bad))
    bad.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: a record must be a JSON object"):
        list(read_jsonl(bad))


def test_tokenizer_directory_errors(tmp_path: Path, tokenizer_dir: Path) -> None:
    with pytest.raises(DataError, match="tokenizer directory not found"):
        open_tokenizer(tmp_path / "missing")
    with pytest.raises(DataError, match=r"no tokenizer\.json"):
        open_tokenizer(tmp_path)
    assert open_tokenizer(str(tokenizer_dir)).eos_token_id is not None


def test_held_out_is_a_stable_fraction_by_program_id() -> None:
    split = HeldOut(fraction=0.1)
    ids = [f"program-{i}" for i in range(5000)]
    held = [pid for pid in ids if split.contains(pid)]
    assert 400 <= len(held) <= 600
    assert held == [pid for pid in ids if HeldOut(fraction=0.1).contains(pid)]
    assert set(held) <= {pid for pid in ids if HeldOut(fraction=0.2).contains(pid)}
    assert not any(HeldOut(fraction=0.0).contains(pid) for pid in ids)
    assert all(HeldOut(fraction=1.0).contains(pid) for pid in ids)
    assert split.keeps("program-1", "all")
    with pytest.raises(DataError, match="unknown split"):
        split.keeps("program-1", "test")  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"in \[0, 1\]"):
        HeldOut(fraction=1.5)


def test_loading_data_imports_neither_torch_nor_triton(tmp_path: Path) -> None:
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [pair_record(i) for i in range(4)])
    programs = write_jsonl(
        tmp_path / "programs.jsonl",
        [{"id": f"p{i}", "level": 1, "source": pair_record(i)["problem"]} for i in range(4)],
    )
    script = f"""
import sys
from learner.tokenizer import train_bpe
from learner.train import data, loader, packing, prompts, sft_data
tok = train_bpe([open({str(pairs)!r}).read()], vocab_size=300)
sft = sft_data.load_sft_data({str(pairs)!r}, tok, seq_len=1024, held_out=data.HeldOut(0.5))
next(sft.train.batches(2, seed=0))
rl = prompts.PromptSource.from_programs({str(programs)!r}, tok, split="all")
next(rl.batches(2, seed=0))
print(sorted(m for m in ("torch", "triton") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
