"""`drtriton verify` and `drtriton sandbox info`: exit status, one JSON object, no tracebacks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sandbox.conftest import (
    GOOD_RELU,
    RELU_PROBLEM,
    REPO_ROOT,
    SYNTAX_ERROR,
    WRONG_RELU,
    free_port,
)


def drtriton(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drtriton_cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    sources = {
        "problem": RELU_PROBLEM,
        "good": GOOD_RELU,
        "wrong": WRONG_RELU,
        "syntax": SYNTAX_ERROR,
    }
    paths = {}
    for name, source in sources.items():
        paths[name] = root / f"{name}.py"
        paths[name].write_text(source)
    return paths


def one_json_object(stdout: str) -> dict:
    """stdout must hold exactly one JSON object (and nothing else)."""
    decoder = json.JSONDecoder()
    text = stdout.strip()
    obj, end = decoder.raw_decode(text)
    assert end == len(text), f"more than one JSON value on stdout: {stdout!r}"
    assert isinstance(obj, dict)
    return obj


def assert_one_line_error(stderr: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("drtriton: error:"), stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("candidate", "code", "verdict"),
    [("good", 0, "correct"), ("wrong", 1, "wrong_output"), ("syntax", 1, "syntax_error")],
)
def test_verify_json_exit_status(
    sandbox_server: str, files: dict[str, Path], candidate: str, code: int, verdict: str
) -> None:
    done = drtriton(
        "verify", str(files["problem"]), str(files[candidate]), "--server", sandbox_server,
        "--no-timing", "--json",
    )  # fmt: skip
    assert done.returncode == code, done.stderr
    result = one_json_object(done.stdout)
    assert result["verdict"] == verdict
    assert {"message", "trials", "candidate_ms", "speedup_vs_eager", "provenance"} <= set(result)
    assert result["candidate_ms"] is None and result["speedup_vs_compile"] is None
    if verdict == "correct":
        assert len(result["trials"]) == 5 and all(t["passed"] for t in result["trials"])
    assert "Traceback" not in done.stderr


def test_verify_human_report(sandbox_server: str, files: dict[str, Path]) -> None:
    done = drtriton(
        "verify", str(files["problem"]), str(files["wrong"]), "--server", sandbox_server,
        "--trials", "2", "--seed", "7",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "WRONG_OUTPUT" in done.stdout
    assert re.search(r"^trials: 0/[12] passed", done.stdout, re.MULTILINE), done.stdout


def test_verify_missing_file_is_a_usage_error(files: dict[str, Path]) -> None:
    done = drtriton("verify", str(files["problem"]), "/nonexistent/candidate.py", "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert_one_line_error(done.stderr)
    assert "/nonexistent/candidate.py" in done.stderr


def test_verify_unreachable_server(files: dict[str, Path]) -> None:
    done = drtriton(
        "verify", str(files["problem"]), str(files["good"]), "--server",
        f"127.0.0.1:{free_port()}", "--retries", "1", "--json",
    )  # fmt: skip
    assert done.returncode == 2
    assert_one_line_error(done.stderr)
    assert "UNAVAILABLE" in done.stderr
    result = one_json_object(done.stdout)
    assert result["verdict"] == "sandbox_error"


def test_verify_locally_without_a_server(files: dict[str, Path]) -> None:
    done = drtriton(
        "verify", str(files["problem"]), str(files["good"]), "--device", "cpu",
        "--trials", "2", "--allow-weak-isolation", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = one_json_object(done.stdout)
    assert result["verdict"] == "correct"
    assert result["provenance"]["interpreter"] is True


def test_sandbox_info(sandbox_server: str) -> None:
    done = drtriton("sandbox", "info", "--server", sandbox_server, "--json")
    assert done.returncode == 0, done.stderr
    info = one_json_object(done.stdout)
    assert info["mode"] == "cpu" and info["workers"] == 2 and info["serving"] is True
    assert info["isolation"]
    human = drtriton("sandbox", "info", "--server", sandbox_server)
    assert human.returncode == 0
    assert "workers:" in human.stdout and "isolation:" in human.stdout


def test_sandbox_info_unreachable() -> None:
    done = drtriton("sandbox", "info", "--server", f"127.0.0.1:{free_port()}", "--timeout", "3")
    assert done.returncode == 2
    assert_one_line_error(done.stderr)


@pytest.mark.parametrize(
    "option, message", [("--workers", "--workers must be at least 1"), ("--spares", "--spares")]
)
def test_serve_rejects_counts_below_one(option: str, message: str) -> None:
    done = drtriton("sandbox", "serve", "--device", "cpu", "--port", "0", option, "0")
    assert done.returncode == 2
    assert_one_line_error(done.stderr)
    assert message in done.stderr
