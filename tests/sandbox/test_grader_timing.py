"""The grader's timing step, driven on the CPU through a scripted candidate process.

On a GPU the candidate times itself with CUDA events; here a stand-in answers the
grader's `stage` and `time` requests the way the harness does, so the grader's own
logic (lock, output check, host-clock cross-check, speedups, stage accounting) runs
for real without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sandbox.config import SandboxConfig
from sandbox.grader import Grader, Job, Rejected, _ProblemEntry
from sandbox.problem import load_problem
from sandbox.result import VerifyResult

PROBLEM = """
import torch

def get_inputs():
    return [torch.randn(16, 16)]

def fused_operator(x):
    return [torch.relu(x)]
"""


class ScriptedCandidate:
    """Answers `stage` and `time` like the harness: `compute` stands for the kernel."""

    def __init__(
        self, job_dir: Path, compute: Callable[[torch.Tensor], torch.Tensor], event_ms: float
    ) -> None:
        self.job_dir = str(job_dir)
        self.compute = compute
        self.event_ms = event_ms
        self.wall_delay_s = 0.0
        self.staged: list[torch.Tensor] = []

    def request(self, deadline: float, **msg: Any) -> dict[str, Any]:
        if msg["cmd"] == "stage":
            self.staged = [Grader._read(spec) for spec in msg["inputs"]]
            return {"ok": True}
        assert msg["cmd"] == "time"
        out = self.compute(*self.staged)
        spec = msg["outputs"][0]
        torch.from_file(spec["path"], shared=True, size=out.numel(), dtype=out.dtype).copy_(
            out.reshape(-1)
        )
        if msg.get("wall"):
            time.sleep(self.wall_delay_s)
            return {"ok": True, "times": [0.0]}
        return {"ok": True, "times": [self.event_ms] * msg["runs"]}


@pytest.fixture
def timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    config = SandboxConfig(device="cpu", job_root=str(tmp_path), timing_runs=5)
    grader = Grader(config, "cpu")
    monkeypatch.setattr(grader, "_baseline_ms", lambda entry, name, inputs: 2.0)
    entry = _ProblemEntry(load_problem(PROBLEM, "functional", "cpu", str(tmp_path)))
    job_dir = tmp_path / "job"
    job_dir.mkdir()

    def run(candidate: ScriptedCandidate) -> VerifyResult:
        result = VerifyResult(verdict="correct")
        job = Job(problem=PROBLEM, candidate="", baselines=("eager",))
        deadline = time.monotonic() + 60
        grader._time(job, entry, candidate, deadline, 1e-4, 1e-4, 1, result)  # type: ignore[arg-type]
        return result

    yield job_dir, run
    grader.close()


def test_honest_timing_reports_the_event_median_and_speedup(timed: Any) -> None:
    job_dir, run = timed
    result = run(ScriptedCandidate(job_dir, torch.relu, event_ms=1.0))
    assert result.candidate_ms == 1.0 and not result.retimed
    assert result.speedup_vs_eager == 2.0
    assert {"timing_io", "timing_wait", "timing"} <= set(result.stage_seconds)


def test_a_wrong_answer_while_timed_is_rejected(timed: Any) -> None:
    job_dir, run = timed
    with pytest.raises(Rejected) as rejected:
        run(ScriptedCandidate(job_dir, torch.abs, event_ms=1.0))
    assert rejected.value.verdict == "wrong_output"
    assert "while being timed" in rejected.value.message


def test_a_rigged_event_timer_is_overruled_by_the_host_clock(timed: Any) -> None:
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=0.001)
    candidate.wall_delay_s = 0.3  # the real work takes far longer than the events claim
    result = run(candidate)
    assert result.retimed
    # The host clock's figure counts: 0.3 s over the 5 timed runs plus one.
    assert result.candidate_ms >= 0.3 * 1e3 / 6
