"""An RL run killed with SIGKILL mid-way and resumed reaches the parameters of a run that
never stopped, bit for bit (real CPU sandbox; overlap on, so steps sampled one update behind
and the drain at checkpoints are covered; evaluations feed the curriculum)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from learner.model import io
from learner.train.metrics import read_metrics

from .conftest import REPO_ROOT, WORKER, run_worker

STEPS = 6
SETTINGS = (
    f"optim.total_steps={STEPS}",
    "checkpoint.every=2",
    "rl.overlap=on",
    "rl.prompts_per_step=2",
    "rl.eval_every=3",
    "rl.eval_problems=2",
)


def last_step(run_dir: Path) -> int:
    return max((int(r["step"]) for r in read_metrics(run_dir) if "rl/loss" in r), default=0)


def params(run_dir: Path) -> dict[str, np.ndarray]:
    model, _ = io.load(run_dir / "model")
    return {k: np.asarray(v) for k, v in io.flat_params(model).items()}


def test_a_killed_rl_run_resumes_to_the_same_parameters(
    sft_policy: Path, sandbox_server: str, tmp_path: Path
) -> None:
    root = str(sft_policy)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run_worker("rl", root, str(straight), sandbox_server, *SETTINGS)

    proc = subprocess.Popen(
        [*WORKER, "rl", root, str(killed), sandbox_server, *SETTINGS],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while proc.poll() is None and last_step(killed) < 3:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, f"the run ended on its own:\n{stderr[-2000:]}"
    assert not (killed / "model").exists(), "killed before the end"
    assert 3 <= last_step(killed) < STEPS

    resumed = run_worker("rl", root, str(killed), sandbox_server, *SETTINGS)
    assert resumed["result"]["steps"] == STEPS

    a, b = params(straight), params(killed)
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name]), f"{name} differs after the resume"
    original = {
        k: np.asarray(v)
        for k, v in io.flat_params(io.load(sft_policy / "sft" / "model")[0]).items()
    }
    assert any(not np.array_equal(a[k], original[k]) for k in a), "RL changed nothing"

    # The metrics read as one run: the same losses, one record per step.
    losses = [[r["rl/loss"] for r in read_metrics(d) if "rl/loss" in r] for d in (straight, killed)]
    assert losses[0] == losses[1] and len(losses[0]) == STEPS
    off = [r["rl/off_policy"] for r in read_metrics(straight) if "rl/loss" in r]
    assert 1.0 in off and 0.0 in off, off
