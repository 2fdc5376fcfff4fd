"""The whole demo loop at its smallest size, through the command line (slow: ~2-3 minutes on
2 CPU cores), then rerun to nothing but reuse; and the same on a GPU when there is one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
STAGES = ("programs", "pairs", "sft", "rl", "search", "eval")


def _demo(*args: str, timeout_s: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drtriton_cli", "demo", "--size", "smoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _check_loop(out: Path, done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    for stage in STAGES:
        assert f"✓ {stage}" in done.stderr, stage
    report = (out / "REPORT.md").read_text()
    assert done.stdout.strip() == report.strip()
    teacher = next(line for line in report.splitlines() if line.startswith("| teacher |"))
    trained = next(line for line in report.splitlines() if line.startswith("| trained ("))
    assert "| 1 |" in teacher and "| 1/1 |" in teacher  # evaluated, and search found an answer
    assert "| 1 |" in trained  # evaluated (what it scores is a toy's)
    for path in ("speedup_curve.png", "sft/curves.png", "rl/curves.png", "rl/model/config.json"):
        assert (out / path).is_file(), path
    for policy in ("teacher", "trained"):
        assert (out / "eval" / policy / "summary.json").is_file()
        assert (out / "search" / policy / "l2-0.json").is_file()


@pytest.mark.slow
def test_the_whole_loop_at_its_smallest_size_then_a_rerun_reuses_it(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    first = _demo("--device", "cpu", "--out", str(out))
    _check_loop(out, first)
    assert "trains a toy" in first.stdout and "n/a (not timed)" in first.stdout

    again = _demo("--device", "cpu", "--out", str(out), timeout_s=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("(reused)") == len(STAGES)
    assert "sandbox server" not in again.stderr  # nothing to verify: no server started


@pytest.mark.gpu
@pytest.mark.slow
def test_the_whole_loop_on_a_gpu(tmp_path: Path) -> None:
    """The CUDA path: the server on the GPU, its gate handed to RL, JAX beside it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    out = tmp_path / "demo"
    done = _demo("--device", "cuda", "--out", str(out))
    _check_loop(out, done)
    assert "workers on cuda" in done.stderr
