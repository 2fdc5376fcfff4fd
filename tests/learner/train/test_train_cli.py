"""`drtriton train sft|plot`: a real run from the command line (which never loads torch or
triton), and bad input as one line on stderr with exit status 2, before any compute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import drtriton_cli
from learner.train.config import config_to_dict, load_config
from learner.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]

# Runs the CLI in a fresh process and then reports which heavy modules were loaded.
_RUN = """\
import json, sys
import drtriton_cli
code = drtriton_cli.main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "triton": "triton" in sys.modules}))
"""


def _sets(pairs: Path, tokenizer_dir: Path, *extra: str) -> list[str]:
    return [
        f"data.pairs={pairs}",
        f"model.tokenizer={tokenizer_dir}",
        "data.seq_len=320",
        "data.batch_size=2",
        "optim.total_steps=4",
        "eval.every=2",
        "eval.pass_at_1_problems=0",
        "checkpoint.every=2",
        "log.every=1",
        *extra,
    ]


def _sft_args(run_dir: Path, pairs: Path, tokenizer_dir: Path, *extra: str) -> list[str]:
    args = ["train", "sft", "--config", "tiny-cpu", "--run-dir", str(run_dir)]
    for item in _sets(pairs, tokenizer_dir, *extra):
        args += ["--set", item]
    return args


def test_train_sft_runs_from_the_command_line_without_torch(
    tmp_path: Path, pairs_file: Path, tokenizer_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, *_sft_args(run_dir, pairs_file, tokenizer_dir)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "torch": False, "triton": False}
    assert "sft: step 4" in proc.stdout
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]
    assert json.loads((run_dir / "config.json").read_text())["optim"]["total_steps"] == 4
    assert (run_dir / "model" / "config.json").is_file()
    assert drtriton_cli.main(["train", "plot", str(run_dir)]) == 0
    assert (run_dir / "curves.png").stat().st_size > 10_000


def _error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = drtriton_cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("drtriton: error: ")
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, pairs_file: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def sft(*extra: str, pairs: Path = pairs_file, tok: Path = tokenizer_dir) -> str:
        return _error_line(capsys, _sft_args(tmp_path / "run", pairs, tok, *extra))

    assert "optim.lrr" in sft("optim.lrr=1") and "optim.lr," in sft("optim.lrr=1")
    assert "no such file" in sft(pairs=tmp_path / "missing.jsonl")
    assert "tokenizer" in sft(tok=tmp_path / "no-tokenizer")
    assert "model.path" in sft("model.path=" + str(tmp_path / "no-model"))
    assert "not a valid int" in sft("optim.total_steps=many")
    bad_pairs = tmp_path / "bad.jsonl"
    bad_pairs.write_text("not json\n")
    assert "bad.jsonl:1" in sft(pairs=bad_pairs)
    assert "unknown preset" in _error_line(capsys, ["train", "sft", "--config", "huge"])
    assert "no metrics" in _error_line(capsys, ["train", "plot", str(tmp_path)])


def test_a_run_dir_with_another_config_is_refused(
    tmp_path: Path, pairs_file: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    sets = _sets(pairs_file, tokenizer_dir, "optim.lr=0.5", f"run_dir={run_dir}")
    cfg = load_config("tiny-cpu", sets)
    (run_dir / "checkpoints" / "2" / "meta").mkdir(parents=True)  # a committed step
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg)))
    line = _error_line(capsys, _sft_args(run_dir, pairs_file, tokenizer_dir))
    assert "another config" in line and "optim.lr: 0.5 -> 0.003" in line


def test_an_unreachable_sandbox_is_refused_before_training(
    tmp_path: Path, pairs_file: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.sandbox.conftest import free_port

    args = _sft_args(
        tmp_path / "run",
        pairs_file,
        tokenizer_dir,
        "eval.pass_at_1_problems=2",
        f"sandbox.servers=127.0.0.1:{free_port()}",
        "sandbox.timeout_s=5",
    )
    line = _error_line(capsys, args)
    assert "no sandbox server" in line and "sandbox.servers" in line
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(("kind", "knob"), [("sft", "data.batch_size"), ("rl", "rl.group_size")])
def test_a_step_that_does_not_fit_says_what_to_change(
    kind: str, knob: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """XLA running out of memory is one line naming the allocation and the settings that
    shrink a step, with exit status 1: not a traceback."""
    import jax.numpy as jnp

    from learner.rl import trainer
    from learner.train import sft

    def too_big(cfg: Any) -> None:
        jnp.zeros((2**42,), jnp.float32).block_until_ready()  # 16 TiB: refused at once

    monkeypatch.setattr(sft if kind == "sft" else trainer, f"run_{kind}", too_big)
    code = drtriton_cli.main(
        ["train", kind, "--config", "tiny-cpu", "--run-dir", str(tmp_path / "run")]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert f"drtriton train {kind}: out of memory on cpu" in err
    assert "17592186044416 bytes" in err and knob in err and "Traceback" not in err
