"""`drtriton teacher translate|build` wiring."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from drtriton_cli import UsageError
from synth.teacher.cli import register

from .programs import render

REPO = Path(__file__).resolve().parents[2]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="drtriton")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_translate_prints_a_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    problem = tmp_path / "problem.py"
    problem.write_text(
        render([[4, 8]], ["torch.relu({0})", "torch.sum({1}, dim=1, keepdim=False)"])
    )
    args = _parse(["teacher", "translate", str(problem)])
    assert args.handler(args) == 0
    code = capsys.readouterr().out
    compile(code, "candidate.py", "exec")
    assert "def triton_fused_operator(tensor_0):" in code and "@triton.jit" in code


def test_translate_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    problem = tmp_path / "problem.py"
    problem.write_text(render([[4, 8]], ["torch.exp({0})"]))
    args = _parse(["teacher", "translate", str(problem)])
    with pytest.raises(UsageError, match=r"unsupported operator `torch.exp`") as err:
        args.handler(args)
    assert "\n" not in str(err.value)
    missing = _parse(["teacher", "translate", str(tmp_path / "nope.py")])
    with pytest.raises(UsageError, match="cannot read"):
        missing.handler(missing)


def test_build_refuses_a_bad_programs_file(tmp_path: Path) -> None:
    bad = tmp_path / "programs.jsonl"
    bad.write_text(json.dumps({"id": "x"}) + "\n")
    args = _parse(
        [
            "teacher",
            "build",
            "--programs",
            str(bad),
            "--out",
            str(tmp_path / "o.jsonl"),
            "--server",
            "localhost:1",
        ]
    )
    with pytest.raises(UsageError, match="needs a `source`"):
        args.handler(args)
    args = _parse(
        [
            "teacher",
            "build",
            "--programs",
            str(tmp_path / "none.jsonl"),
            "--out",
            str(tmp_path / "o.jsonl"),
        ]
    )
    with pytest.raises(UsageError, match="no such programs file"):
        args.handler(args)


def test_drtriton_entry_point(tmp_path: Path) -> None:
    """Through the real `drtriton` entry point, once `synth.cli` registers the teacher."""
    import drtriton_cli

    try:
        drtriton_cli.build_parser().parse_args(["teacher", "translate", "x.py"])
    except SystemExit:
        pytest.skip("synth.cli does not register the teacher yet")
    problem = tmp_path / "problem.py"
    problem.write_text(render([[4, 8]], ["torch.exp({0})"]))
    run = subprocess.run(
        [sys.executable, "-m", "drtriton_cli", "teacher", "translate", str(problem)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "torch.exp" in run.stderr
