"""One job and its context: what was asked, the problem, tolerances, seeds, deadline, stages.

`Job` is the request as the runner hands it over; `JobContext` is what every step of the
grading (`sandbox.grading.trials`, `sandbox.grading.timed`) needs to know about the job it
serves, with the host-wide resources those steps use (the GPU gate, the clock), so that a
step takes the context and the candidate process and nothing else.
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass, field
from typing import Any

from sandbox import compare, timed_inputs
from sandbox.config import DEFAULT_TRIALS, SandboxConfig
from sandbox.gpu_gate import GpuGate, SharedHold
from sandbox.grading import gpu
from sandbox.grading.stages import stage, waited_s
from sandbox.problem import Problem
from sandbox.process import CandidateDied, CandidateProcess
from sandbox.result import VerifyResult
from sandbox.transfer import Exchange


@dataclass
class Job:
    problem: str
    candidate: str
    request_id: str = ""
    format: str = "auto"
    trials: int = DEFAULT_TRIALS
    atol: float | None = None
    rtol: float | None = None
    timing: bool = True
    baselines: tuple[str, ...] = ("eager", "torch_compile")
    budget_s: float = 120.0
    seed: int | None = None
    # Baseline times other graders already measured for this problem (ms).
    known_baselines: dict[str, float | None] = field(default_factory=dict)
    # Another job of this problem measures its baselines; the runner adds them.
    defer_baselines: bool = False


@dataclass
class ProblemEntry:
    """A loaded problem and what the grader learned about it (cached per problem source)."""

    problem: Problem
    degenerate: str | None = None
    # Per output, what the reference's own float32 error allows (extra absolute tolerance,
    # near-ties), measured the first time a candidate misses the tolerance (`compare.allowance`).
    noise: list[compare.Allowance] | None = None
    baseline_ms: dict[str, float | None] = field(default_factory=dict)
    io_bytes: int | None = None
    input_layout: list[dict[str, Any]] | None = None

    def io(self) -> int:
        """Bytes of one set of inputs and outputs (computed once)."""
        if self.io_bytes is None:
            self.io_bytes = self.problem.io_bytes()
        return self.io_bytes

    def timing_bytes(self, runs: int, warmup: int) -> tuple[int, int]:
        """GPU memory a timed job needs beyond one set of I/O (its extra input sets and
        kept outputs, `sandbox.timed_inputs`): (the candidate's, the grader's)."""
        if self.input_layout is None:
            self.input_layout = self.problem.input_layout()
        ins = timed_inputs.layout_bytes(self.input_layout)
        outs = max(0, self.io() - ins)
        plan = timed_inputs.plan_timing(ins, outs, runs, warmup)
        return timed_inputs.extra_bytes(plan, ins, outs)


def without_frames(error: BaseException) -> BaseException:
    """`error` (and the errors it was raised from or during) with no traceback: the frames
    of a failed job hold its tensors (staged input sets, expected outputs), which would
    otherwise outlive the job's memory release and stay in PyTorch's cache, outside every
    reservation, for as long as the error is kept."""
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        traceback.clear_frames(link.__traceback__)
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


class Rejected(Exception):
    """The candidate (or the problem) fails a check: `verdict` is the job's answer."""

    def __init__(self, verdict: str, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def death_verdict(death: CandidateDied, result: VerifyResult, budget_s: float) -> tuple[str, str]:
    """A timeout of a job that spent most of its budget waiting for others is the
    sandbox's (`sandbox_error`, which clients retry), not the kernel's."""
    waited = waited_s(result)
    if death.verdict != "timeout" or waited < budget_s / 2:
        return death.verdict, death.message
    return "sandbox_error", (
        f"the job ran out of time after waiting {waited:.0f} s of its {budget_s:.0f} s budget "
        f"for GPU memory or the GPU (a busy sandbox, not the kernel): {death.message}"
    )


@dataclass
class JobContext:
    """One job as its grading steps see it; `result` collects the answer as they go."""

    job: Job
    entry: ProblemEntry
    atol: float
    rtol: float
    deadline: float  # time.monotonic() by which the job must be answered
    base_seed: int  # secret: trial i draws its inputs from base_seed + i
    result: VerifyResult
    config: SandboxConfig
    device: str
    gate: GpuGate | None = None  # None: no GPU to share (CPU mode)
    clock: Any = None  # `sandbox.timing.Clock` on a GPU, None without timing
    share_memory: bool = False  # tensors may cross in shared device memory

    @property
    def problem(self) -> Problem:
        return self.entry.problem

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]:
        return stage(self.result, name)

    def shared(self) -> contextlib.AbstractContextManager[SharedHold | None]:
        """A share of the GPU for correctness work (`sandbox.grading.gpu.shared_hold`)."""
        return gpu.shared_hold(self.gate, self.result)

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """The GPU alone for a timed loop (`sandbox.grading.gpu.exclusive_hold`)."""
        return gpu.exclusive_hold(self.gate, self.result)

    def candidate_gpu_bytes(self) -> int:
        """The candidate's GPU memory cap (`gpu.candidate_gpu_bytes`), its timing included."""
        extra = 0
        if self.job.timing and self.device == "cuda":
            extra = self.entry.timing_bytes(self.config.timing_runs, self.config.timing_warmup)[0]
        return gpu.candidate_gpu_bytes(self.entry.io(), extra)

    def exchange(self, proc: CandidateProcess) -> Exchange:
        """Memory for the tensors of one command to `proc` (`sandbox.transfer`)."""
        return Exchange(proc.job_dir, self.device, self.share_memory)
