"""The grader's timing step, driven on the CPU through a scripted candidate process.

On a GPU the candidate times itself with CUDA events; here a stand-in answers the
grader's `stage`, `time`, `ping` and `fetch` requests the way the harness does, so
the grader's own logic (lock, output check, host-clock cross-check, stage
accounting) runs for real without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sandbox import timed_inputs
from sandbox.config import SandboxConfig
from sandbox.gpu_gate import GpuGate
from sandbox.grader import Grader
from sandbox.grading import timed as timed_step
from sandbox.grading.job import Job, JobContext, ProblemEntry, Rejected
from sandbox.problem import load_problem
from sandbox.process import CandidateDied
from sandbox.result import VerifyResult
from sandbox.timing import HOST_LOOP_MAX_FACTOR, HOST_LOOP_REPEATS
from sandbox.transfer import numel_of

PROBLEM = """
import torch

def get_inputs():
    return [torch.randn(16, 16)]

def fused_operator(x):
    return [torch.relu(x)]
"""


class ScriptedCandidate:
    """Answers like the harness (`sandbox.timed_harness`): `compute` stands for the kernel."""

    def __init__(
        self, job_dir: Path, compute: Callable[[torch.Tensor], torch.Tensor], event_ms: float
    ) -> None:
        self.job_dir = str(job_dir)
        self.compute = compute
        self.event_ms = event_ms
        self.wall_delay_s = 0.0  # host seconds per call of a wall loop
        self.wall_stalls: list[float] = []  # one-off delays of the next wall loops
        self.hang = False  # the timed loop never ends (until the deadline kills it)
        self.sets: list[list[torch.Tensor]] = []
        self.timed: dict[str, dict[int, list[torch.Tensor]]] = {}
        self.commands: list[str] = []
        self.fetched: list[tuple[str, int]] = []  # (slot, call) of each fetch of outputs
        self.kept: dict[str, list[int]] = {}  # what the grader said to keep, by slot
        self.wall_runs: list[int] = []
        self.loops: list[dict[str, Any]] = []  # each `time` command
        self.proc = SimpleNamespace(pid=2**22 + 1)  # no such process group to renice

    def request(self, deadline: float, **msg: Any) -> dict[str, Any]:
        self.commands.append(msg["cmd"])
        if msg["cmd"] == "stage":  # as the harness does: one packed buffer, viewed by set
            spec = msg["inputs"][0]
            buffer = torch.from_file(spec["path"], size=numel_of(spec), dtype=torch.uint8)
            self.sets = timed_inputs.unpack(buffer.clone(), msg["layout"])
            return {"ok": True}
        if msg["cmd"] == "ping":
            return {"ok": True}
        if msg["cmd"] == "fetch":
            for slot, calls in msg["keep"].items():
                self.kept[slot] = list(calls)
                self.timed[slot] = {c: self.timed[slot][c] for c in calls}
            for slot, specs in msg["outputs"].items():
                call = msg["calls"][slot]
                self.fetched.append((slot, call))
                out = self.compute(*self.timed[slot][call])
                torch.from_file(
                    specs[0]["path"], shared=True, size=out.numel(), dtype=out.dtype
                ).copy_(out.reshape(-1))
            return {"ok": True}
        assert msg["cmd"] == "time"
        self.loops.append(msg)
        if self.hang:
            time.sleep(max(0.0, deadline - time.monotonic()))
            raise CandidateDied("timeout", "exceeded its time budget")
        calls = msg["runs"] + (1 if msg["wall"] else msg["warmup"])
        schedule = msg["schedule"]
        assert len(schedule) == calls
        keep = min(msg["keep"], calls)
        # Each kept call's inputs; its output is computed when fetched (no time taken here).
        self.timed[msg["slot"]] = {c: self.sets[schedule[c]] for c in range(calls - keep, calls)}
        if msg["wall"]:
            self.wall_runs.append(msg["runs"])
            stall = self.wall_stalls.pop(0) if self.wall_stalls else 0.0
            time.sleep(self.wall_delay_s * (msg["runs"] + 1) + stall)
            return {"ok": True, "times": [0.0]}
        return {"ok": True, "times": [self.event_ms] * msg["runs"]}


def _timing_grader(
    tmp_path: Path, problem: str, tolerance: float = 1e-4
) -> tuple[Grader, ProblemEntry, Path, Callable[..., VerifyResult]]:
    config = SandboxConfig(device="cpu", job_root=str(tmp_path), timing_runs=5)
    grader = Grader(config, "cpu")
    grader.gate = GpuGate(str(tmp_path))  # what a GPU grader has; timing takes it alone
    entry = ProblemEntry(load_problem(problem, "functional", "cpu", str(tmp_path)))
    job_dir = tmp_path / "job"
    job_dir.mkdir()

    def run(candidate: ScriptedCandidate, slowest_call_s: float = 0.001) -> VerifyResult:
        result = VerifyResult(verdict="correct")
        context = JobContext(
            job=Job(problem=problem, candidate=""),
            entry=entry,
            atol=tolerance,
            rtol=tolerance,
            deadline=time.monotonic() + 60,
            base_seed=1,
            result=result,
            config=config,
            device="cpu",
            gate=grader.gate,
        )
        timed_step.time_candidate(context, candidate, slowest_call_s)  # type: ignore[arg-type]
        return result

    return grader, entry, job_dir, run


@pytest.fixture
def timed(tmp_path: Path) -> Any:
    grader, _, job_dir, run = _timing_grader(tmp_path, PROBLEM)
    yield job_dir, run
    grader.close()


def test_honest_timing_reports_the_event_median(timed: Any) -> None:
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=1.0)
    result = run(candidate)
    assert result.candidate_ms == 1.0 and not result.retimed
    assert {"timing_io", "timing_wait", "timing"} <= set(result.stage_seconds)
    # Outputs are fetched after both timed loops, never inside them, one loop's at a time
    # (the grader holds one set of timed outputs, not two).
    # The events loop's outputs but the grader's picks are let go before the host-clock
    # loop; the picked calls' outputs are fetched after both loops, one call at a time.
    picks = 2 * timed_inputs.TIMED_PICKS
    assert candidate.commands == ["stage", "time", "fetch", "ping", "time"] + ["fetch"] * picks
    assert sorted(candidate.fetched) == sorted(
        [("events", c) for c in candidate.kept["events"]]
        + [(s, c) for s, c in candidate.fetched if s == "wall"]
    )
    assert len({c for s, c in candidate.fetched if s == "events"}) == timed_inputs.TIMED_PICKS


def test_a_timed_loop_that_outlasts_its_lease_is_killed_as_a_timeout(
    timed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop far slower than its trials would hold every other job's GPU work: bounded."""
    monkeypatch.setattr(timed_step, "TIMING_LEASE_S", 0.3)
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=1.0)
    candidate.hang = True
    started = time.monotonic()
    with pytest.raises(CandidateDied) as died:
        run(candidate)
    assert died.value.verdict == "timeout"
    assert "timed loop ran past" in died.value.message
    assert time.monotonic() - started < 5  # the lease, not the job's 60 s deadline


def test_timed_loops_of_slow_calls_are_shorter() -> None:
    from sandbox.timing import MIN_TIMED_RUNS, TIMED_LOOP_BUDGET_MS, runs_within_budget

    assert runs_within_budget(0.01, 50) == 50
    assert runs_within_budget(TIMED_LOOP_BUDGET_MS / 20, 50) == 20
    assert runs_within_budget(10 * TIMED_LOOP_BUDGET_MS, 50) == MIN_TIMED_RUNS
    assert runs_within_budget(0.0, 50) == 50  # no estimate: the configured loop
    assert timed_step.loop_sizes(0.01, 50, 5) == (50, 5)
    assert timed_step.loop_sizes(10 * TIMED_LOOP_BUDGET_MS, 50, 5) == (MIN_TIMED_RUNS, 1)


def test_a_slow_candidate_is_timed_over_fewer_runs(
    timed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandbox.timing

    monkeypatch.setattr(sandbox.timing, "MIN_TIMED_RUNS", 2)
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=1.0)
    # Trials took a second per call: a 2 s loop budget is two runs, not the five configured.
    result = run(candidate, slowest_call_s=1.0)
    assert result.timing_runs == 2


def test_a_slow_baselines_host_check_lasts_about_the_host_loop() -> None:
    from sandbox.timing import HOST_LOOP_MS

    assert timed_step.baseline_host_runs(0.01, 50) == 50  # quick calls: the whole loop, as before
    assert timed_step.baseline_host_runs(HOST_LOOP_MS / 4, 5) == 4
    assert timed_step.baseline_host_runs(2400.0, 5) == 1  # a 2.4 s call: one run, not five
    assert timed_step.baseline_host_runs(0.0, 7) == 7  # no event time: the configured loop


def test_speedups_come_from_the_baselines_and_flag_implausible_ones() -> None:
    result = VerifyResult(verdict="correct", candidate_ms=0.5)
    result.apply_baselines(1.0, 2.0, sanity_bound=20.0)
    assert (result.speedup_vs_eager, result.speedup_vs_compile) == (2.0, 4.0)
    assert not result.retimed
    result.apply_baselines(100.0, None, sanity_bound=20.0)
    assert result.speedup_vs_eager == 200.0 and result.speedup_vs_compile is None
    assert result.retimed
    untimed = VerifyResult(verdict="wrong_output")
    untimed.apply_baselines(1.0, 2.0, sanity_bound=20.0)
    assert untimed.eager_ms == 1.0 and untimed.speedup_vs_eager is None


def test_a_wrong_answer_while_timed_is_rejected(timed: Any) -> None:
    job_dir, run = timed
    with pytest.raises(Rejected) as rejected:
        run(ScriptedCandidate(job_dir, torch.abs, event_ms=1.0))
    assert rejected.value.verdict == "wrong_output"
    assert "while being timed" in rejected.value.message


ROW_SUM = """
import torch

def get_inputs():
    return [torch.randn(16, 8192)]

def fused_operator(x):
    return [torch.sum(x, dim=1)]
"""


def test_a_timed_output_gets_the_references_rounding_allowance(tmp_path: Path) -> None:
    """Trials that passed without the allowance do not make the timed check stricter."""
    grader, entry, job_dir, run = _timing_grader(tmp_path, ROW_SUM, tolerance=1e-9)

    def blocked_sum(x: torch.Tensor) -> torch.Tensor:  # another order than PyTorch's
        return x.view(16, 16, 512).sum(dim=1).sum(dim=1)

    try:
        assert entry.noise is None  # as after trials that passed by value alone
        result = run(ScriptedCandidate(job_dir, blocked_sum, event_ms=1.0))
        assert result.candidate_ms == 1.0
        assert entry.noise is not None and 0 < entry.noise[0].atol < 1e-2
        # The allowance is rounding-sized: a real error made while timed is still caught.
        with pytest.raises(Rejected, match="while being timed"):
            run(ScriptedCandidate(job_dir, lambda x: blocked_sum(x) + 0.01, event_ms=1.0))
    finally:
        grader.close()


def test_a_rigged_event_timer_is_overruled_by_the_host_clock(timed: Any) -> None:
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=0.001)
    candidate.wall_delay_s = 0.02  # the real work takes far longer than the events claim
    result = run(candidate)
    assert result.retimed
    assert result.candidate_ms >= 20.0  # the host clock's figure counts
    # No loop came near the events: all of them ran (each as long as the cap allows: the
    # events claim 1 us a call), and the quickest counts.
    assert candidate.wall_runs == [HOST_LOOP_MAX_FACTOR * 5] * HOST_LOOP_REPEATS


def test_a_stalled_host_loop_does_not_slow_an_honest_kernel(timed: Any) -> None:
    """A process descheduled during one host loop only adds to it: the quickest counts."""
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=5.0)
    candidate.wall_delay_s = 0.004  # honest: the host agrees with the events (with room)
    candidate.wall_stalls = [0.2]  # but the first loop lost 200 ms to the scheduler
    result = run(candidate)
    assert len(candidate.wall_runs) == 2  # a second loop, and none after it agreed
    assert result.candidate_ms == 5.0 and not result.retimed


def test_host_loops_go_on_while_they_are_slower_than_the_events(timed: Any) -> None:
    """A launch-bound kernel's host loops are all slower than its events: the quickest of
    all three counts, even where two slow ones agree (a busy host delays both)."""
    job_dir, run = timed
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=1.0)
    candidate.wall_delay_s = 0.004
    candidate.wall_stalls = [0.4, 0.4]  # the first two loops lost the same time
    result = run(candidate)
    assert len(candidate.wall_runs) == 3
    assert result.retimed and result.candidate_ms == pytest.approx(4.0, rel=0.25)


def test_a_host_loop_close_to_the_events_ends_the_check(
    timed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir, run = timed
    monkeypatch.setattr("sandbox.timing.HOST_LOOP_AGREE", 0.5)
    candidate = ScriptedCandidate(job_dir, torch.relu, event_ms=4.0)
    candidate.wall_delay_s = 0.0044  # 10% above the events: within the (widened) margin
    result = run(candidate)
    assert len(candidate.wall_runs) == 1
    assert result.retimed and result.candidate_ms == pytest.approx(4.4, rel=0.2)


def test_quickest_loop_draws_loops_only_until_one_is_close_to_the_events() -> None:
    from sandbox.timing import quickest_loop

    drawn: list[float] = []

    def loops(*values: float) -> Iterator[float]:
        for value in values:
            drawn.append(value)
            yield value

    assert quickest_loop(1.0, loops(1.5, 1.01, 0.9), 0.02) == 1.01
    assert drawn == [1.5, 1.01]
    drawn.clear()
    assert quickest_loop(1.0, loops(1.5, 1.5, 1.2), 0.02) == 1.2
    assert drawn == [1.5, 1.5, 1.2]


def test_host_loops_last_long_enough_within_a_cap() -> None:
    from sandbox.timing import HOST_LOOP_MS, host_timed_runs

    assert host_timed_runs(HOST_LOOP_MS / 30, 12) == 30  # a 12-run loop would be too short
    assert host_timed_runs(0.001, 12) == HOST_LOOP_MAX_FACTOR * 12  # tiny kernels: capped
    assert host_timed_runs(HOST_LOOP_MS, 12) == 12  # never fewer than the event loop
    assert host_timed_runs(0.0, 12) == 12


def test_each_timed_run_hides_the_launch_and_ends_on_the_stream() -> None:
    """wake, warm-up, device sync; per run flush, hold (else a busy wait), start, call,
    end, release; one device sync at the end: the order it rests on."""
    from sandbox.timing import Clock, time_cuda

    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.at = 0.0

    ticks = iter(range(1000))

    def record(event: Event) -> None:
        event.at = float(next(ticks))
        log.append("record")

    clock = Clock(
        event_type=Event,
        record=record,
        elapsed=lambda start, end: end.at - start.at,
        synchronize=lambda: log.append("sync"),
        flush=lambda: log.append("flush"),
        busy=lambda: log.append("busy"),
        cycles_per_us=1.0,
        wake=lambda: log.append("wake"),
        hold=lambda: log.append("hold"),
        release=lambda: log.append("release"),
        held=True,
    )
    times = time_cuda(lambda: log.append("call"), clock, runs=2, warmup=1)
    run = ["flush", "hold", "record", "call", "record", "release"]
    assert log == ["wake", "call", "sync"] + run * 2 + ["sync"]
    assert times == [1.0, 1.0]

    log.clear()  # a run's inputs come ahead of its flush, outside its events
    time_cuda(
        lambda: log.append("call"), clock, 2, 1, before_run=lambda i: log.append(f"bring {i}")
    )
    run = ["flush", "hold", "record", "call", "record", "release"]
    assert log == ["wake", "call", "sync", "bring 0", *run, "bring 1", *run, "sync"]

    log.clear()
    spin_only = dataclasses.replace(clock, held=False)
    time_cuda(lambda: log.append("call"), spin_only, runs=2, warmup=0)
    run = ["flush", "hold", "busy", "record", "call", "record", "release"]
    assert log == ["wake", "sync"] + run * 2 + ["sync"]

    def broken() -> None:
        log.append("call")
        raise RuntimeError("the candidate failed")

    log.clear()
    with pytest.raises(RuntimeError):
        time_cuda(broken, clock, runs=1, warmup=0)
    assert log[-2:] == ["call", "release"]  # a failed call leaves no stream held


def test_the_larger_of_event_and_host_time_counts() -> None:
    from sandbox.timing import reported_ms

    assert reported_ms(1.0, 0.8) == (1.0, False)  # warm back-to-back runs: events count
    assert reported_ms(0.1, 0.8) == (0.8, True)  # events too good to be true


def test_a_timeout_after_waiting_for_others_is_the_sandboxs() -> None:
    """Jobs that spent their budget queued for GPU memory were judged `timeout`, as if
    their kernels hung; those are retried now, a kernel that hangs is still a timeout."""
    from sandbox.grading.job import death_verdict

    hung = CandidateDied("timeout", "exceeded its time budget")
    waited = VerifyResult(verdict="correct", stage_seconds={"gpu_memory_wait": 97.0})
    verdict, message = death_verdict(hung, waited, budget_s=115.0)
    assert verdict == "sandbox_error" and "waiting 97 s" in message
    quick = VerifyResult(verdict="correct", stage_seconds={"gpu_memory_wait": 2.0, "gpu_wait": 1.0})
    assert death_verdict(hung, quick, budget_s=115.0) == ("timeout", hung.message)
    crashed = CandidateDied("runtime_error", "segfault")
    assert death_verdict(crashed, waited, budget_s=115.0)[0] == "runtime_error"


def test_an_out_of_memory_error_names_the_stage_it_left() -> None:
    """A GPU shortage is reported with where the grader was: what to size the budget by."""
    from sandbox.grading.stages import stage

    result = VerifyResult(verdict="correct")
    with (
        pytest.raises(torch.cuda.OutOfMemoryError) as raised,
        stage(result, "problem"),
        stage(result, "reference"),
    ):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.99 GiB")
    assert raised.value.__notes__ == ["in the grader's reference stage"]
    assert {"problem", "reference"} <= set(result.stage_seconds)


class _HostEvent:
    def __init__(self, enable_timing: bool = True) -> None:
        self.at = 0.0


def _host_clock() -> Any:
    """CUDA events stood in for by the host clock: a baseline's timing runs on the CPU."""
    from sandbox.timing import Clock

    def record(event: _HostEvent) -> None:
        event.at = time.perf_counter()

    return Clock(
        event_type=_HostEvent,
        record=record,
        elapsed=lambda start, end: (end.at - start.at) * 1e3,
        synchronize=lambda: None,
        flush=lambda: None,
        busy=lambda: None,
        cycles_per_us=1.0,
    )


def test_a_slow_baseline_is_timed_without_a_long_host_check(tmp_path: Path) -> None:
    config = SandboxConfig(device="cpu", job_root=str(tmp_path), timing_runs=5, timing_warmup=1)
    grader = Grader(config, "cpu")
    grader.gate = GpuGate(str(tmp_path))
    grader.clock = _host_clock()
    entry = ProblemEntry(load_problem(PROBLEM, "functional", "cpu", str(tmp_path)))
    calls: list[float] = []

    def slow_relu(x: torch.Tensor) -> list[torch.Tensor]:
        calls.append(time.monotonic())
        time.sleep(0.15)  # longer than the host loop (`timing.HOST_LOOP_MS`)
        return [torch.relu(x)]

    entry.problem.reference_fn = slow_relu
    result = VerifyResult(verdict="correct")
    try:
        timed_step.measure_baselines(entry, ["eager"], result, grader.gate, grader.clock, 5, 1)
    finally:
        grader.close()
    assert entry.baseline_ms["eager"] == pytest.approx(150, rel=0.3)
    # Sizing (2 calls), a warm-up and 5 timed runs, then a host check of 1 run (2 calls):
    # 10 calls, where a host check as long as the event loop made it 14.
    assert len(calls) == 10


def _baseline_host_checks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    call_s: float,
    slower: Callable[[int], float],
) -> tuple[float | None, list[float]]:
    """The eager baseline of a reference that sleeps `call_s` a call, timed by host-clock
    events, with host loop i (0: the sizing call) reading `slower(i)` times `call_s` (a
    fixed figure: real sleeps on a busy 2-core host read up to 10% long, and the grader
    would rightly check such a loop again). Returns the baseline and every host loop's
    figure."""
    import sandbox.timing

    config = SandboxConfig(device="cpu", job_root=str(tmp_path), timing_runs=5, timing_warmup=1)
    grader = Grader(config, "cpu")
    grader.gate = GpuGate(str(tmp_path))
    grader.clock = _host_clock()
    entry = ProblemEntry(load_problem(PROBLEM, "functional", "cpu", str(tmp_path)))

    def sleepy_relu(x: torch.Tensor) -> list[torch.Tensor]:
        time.sleep(call_s)
        return [torch.relu(x)]

    entry.problem.reference_fn = sleepy_relu
    host_loops: list[float] = []

    def skewed(fn: Any, clock: Any, runs: int) -> float:
        ms = 1e3 * call_s * slower(len(host_loops))
        host_loops.append(ms)
        return ms

    monkeypatch.setattr(sandbox.timing, "time_wall", skewed)
    try:
        timed_step.measure_baselines(
            entry, ["eager"], VerifyResult(verdict="correct"), grader.gate, grader.clock, 5, 1
        )
    finally:
        grader.close()
    return entry.baseline_ms["eager"], host_loops


def test_a_baselines_delayed_host_loop_is_checked_again_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grader's own scheduling delays in a baseline's host loop would be cached with it
    and bias every candidate of the problem: a loop well above the events is run again,
    and one close to them leaves the events' figure."""
    # The first host check (after the sizing call) lost 30%.
    eager, host_loops = _baseline_host_checks(
        tmp_path, monkeypatch, 0.01, lambda i: 1.3 if i == 1 else 1.0
    )
    assert len(host_loops) == 3  # sizing, the delayed check, one more that agreed
    assert eager == pytest.approx(10.0, rel=0.1)
    assert eager < host_loops[1]


def test_a_slow_baselines_host_check_runs_once_even_when_it_disagrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work the events miss (a host check well above them) counts, and a call longer than
    the host loop (`timing.HOST_LOOP_MS`) is not checked three times over: each check
    would cost its seconds."""
    # After the sizing call every host check reads twice the events' figure.
    eager, host_loops = _baseline_host_checks(
        tmp_path, monkeypatch, 0.12, lambda i: 2.0 if i else 1.0
    )
    assert len(host_loops) == 2  # sizing and one host check
    assert eager == pytest.approx(240, rel=0.3)


def test_a_timed_job_reserves_gpu_memory_for_its_extra_input_sets(tmp_path: Path) -> None:
    """The GPU grader's memory reservation of a timed job (run here on CPU with a budget and
    a clock as a GPU grader has them): it counts the timed loops' extra sets and kept
    outputs, sized from the problem's input layout alone."""
    from sandbox.gpu_budget import GpuMemoryBudget

    config = SandboxConfig(device="cpu", job_root=str(tmp_path), timing_runs=5, timing_warmup=1)
    grader = Grader(config, "cpu")
    grader.clock = _host_clock()
    grader.gpu_budget = GpuMemoryBudget(str(tmp_path / "gpu-memory.budget"), 64)
    entry = ProblemEntry(load_problem(PROBLEM, "functional", "cpu", str(tmp_path)))
    try:
        untimed = VerifyResult(verdict="correct")
        timed = VerifyResult(verdict="correct")
        for result, timing in ((untimed, False), (timed, True)):
            job = Job(problem=PROBLEM, candidate="", timing=timing)
            with contextlib.ExitStack() as held:
                grader._reserve_gpu(job, entry, time.monotonic() + 30, result, held)
    finally:
        grader.close()
    one_set = 16 * 16 * 4
    assert timed_inputs.layout_bytes(entry.problem.input_layout()) == one_set
    plan = timed_inputs.plan_timing(one_set, one_set, 5, 1)
    assert entry.timing_bytes(5, 1) == timed_inputs.extra_bytes(plan, one_set, one_set)
    assert plan.sets > 1 and entry.timing_bytes(5, 1)[0] > 0
    assert timed.gpu_memory_gib["reserved"] >= untimed.gpu_memory_gib["reserved"] > 0
