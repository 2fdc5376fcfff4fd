"""`drtriton synth generate|stats`: output file, atomic write and resume, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import drtriton_cli
import synth.generate
from synth.profiles import TINY

REQUIRED = {
    "id",
    "level",
    "ops",
    "source",
    "input_shapes",
    "output_shapes",
    "flops",
    "bytes",
    "profile",
    "seed",
}


def run(*argv: str) -> int:
    return drtriton_cli.main(["synth", *argv])


def test_generate_writes_records_and_stats_summarises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "progs.jsonl"
    assert run("generate", "--level", "2", "--count", "4", "--seed", "5", "--out", str(out)) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # progress and summary go to stderr
    assert "wrote 4 programs" in captured.err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4
    for rec in records:
        assert set(rec) >= REQUIRED
        assert (
            rec["level"] == 2
            and len(rec["ops"]) == 2
            and rec["profile"] == "tiny"
            and rec["seed"] == 5
        )
    assert not list(tmp_path.glob("*.partial*"))

    assert run("stats", str(out)) == 0
    text = capsys.readouterr().out
    assert "programs: 4" in text and "operator coverage:" in text and "FLOPs" in text
    png = tmp_path / "progs.jsonl.stats.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_interrupted_run_leaves_no_file_and_resumes_byte_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["generate", "--level", "2", "--count", "5", "--seed", "3", "--quiet"]
    reference = tmp_path / "reference.jsonl"
    assert run(*args, "--out", str(reference)) == 0

    real = synth.generate.generate_programs

    def interrupted(*a, **k):
        for n, rec in enumerate(real(*a, **k)):
            if n == 2:
                raise KeyboardInterrupt
            yield rec

    out = tmp_path / "out.jsonl"
    monkeypatch.setattr(synth.generate, "generate_programs", interrupted)
    assert run(*args, "--out", str(out)) == 130
    assert not out.exists()
    partial = tmp_path / "out.jsonl.partial"
    assert len(partial.read_text().splitlines()) == 2
    with open(partial, "a") as f:
        f.write('{"id": "torn')  # a crash in the middle of a line
    monkeypatch.setattr(synth.generate, "generate_programs", real)
    assert run(*args, "--out", str(out)) == 0
    assert out.read_bytes() == reference.read_bytes()
    assert not partial.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ops", "relu,frobnicate"], "unknown operator(s): frobnicate"),
        (["--level", "0"], "--level must be in"),
        (["--level", "999"], "--level must be in"),
        (["--profile", "huge"], "unknown profile"),
        (["--out", "/nonexistent-dir/x.jsonl"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--level": "1", "--count": "1", "--out": str(tmp_path / "x.jsonl")}
    for k, v in zip(argv[::2], argv[1::2], strict=True):
        base[k] = v
    flat = [x for kv in base.items() for x in kv]
    assert run("generate", *flat) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and err.startswith("drtriton: error:")


def test_operator_list_the_profile_cannot_satisfy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Softmax needs an axis of length >= 2, which a profile of 1-sized dims cannot give."""
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({**TINY.to_dict(), "name": "flat", "max_dim": 1, "flops_min": 1}))
    out = tmp_path / "x.jsonl"
    argv = [
        "generate",
        "--level",
        "1",
        "--count",
        "1",
        "--ops",
        "softmax",
        "--profile",
        str(flat),
        "--out",
        str(out),
    ]
    assert run(*argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert err.startswith("drtriton: error: no valid level-1 program")
    assert not out.exists()


def test_stats_of_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("stats", str(tmp_path / "nope.jsonl")) == 2
    assert "no such file" in capsys.readouterr().err


def test_synth_without_subcommand_prints_help() -> None:
    assert run() == 2
