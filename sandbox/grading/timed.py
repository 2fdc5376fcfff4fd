"""Timing on a GPU: the candidate's timed loops and the eager / torch.compile baselines.

The candidate times itself with CUDA events, cross-checked by this process's clock (a
rigged event timer shows up as host time above the reported median, and then the host
time counts); the outputs of its timed loops are judged like a trial's. Each timed loop,
the candidate's or a baseline's, has the GPU to itself (`gpu.exclusive_hold`), for a lease
the candidate's correctness trials bound. Baselines are measured once per problem.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import torch

from sandbox import compare
from sandbox.gpu_gate import GpuGate
from sandbox.grading import judgment
from sandbox.grading.gpu import exclusive_hold, shared_hold
from sandbox.grading.job import Job, JobContext, ProblemEntry, Rejected
from sandbox.grading.stages import add_stage, stage
from sandbox.grading.trials import raise_failure, raise_if_gpu_full
from sandbox.problem import Problem
from sandbox.process import CandidateDied, CandidateProcess
from sandbox.result import VerifyResult
from sandbox.zygote import CANDIDATE_NICE, TIMED_NICE

# A timed loop has the GPU alone for at most this long, plus TIMING_LEASE_FACTOR times
# what its runs would take at the pace of the slowest correctness trial; a loop that
# overruns that is killed (a `timeout`): it was not the kernel its trials showed.
TIMING_LEASE_S = 5.0
TIMING_LEASE_FACTOR = 3.0


def event_times(reply: dict[str, Any], runs: int) -> list[float]:
    """The timed loop's event times; empty when it failed or sent impossible ones."""
    if not reply.get("ok"):
        return []
    try:
        times = [float(t) for t in reply.get("times", [])]
    except (TypeError, ValueError):
        return []
    return times if len(times) == runs and all(t > 0 for t in times) else []


def loop_sizes(per_call_ms: float, runs: int, warmup: int) -> tuple[int, int]:
    """Timed runs and warm-up calls for a call this slow (`timing.runs_within_budget`)."""
    from sandbox.timing import runs_within_budget

    timed = runs_within_budget(per_call_ms, runs)
    return timed, warmup if timed == runs else min(warmup, 1)


def baseline_host_runs(event_ms: float, runs: int) -> int:
    """Runs of a baseline's host-clock check: about `timing.HOST_LOOP_MS` of them.

    PyTorch's own code needs no guard against a rigged timer, only a check that its events
    saw all its work: a whole-tensor layer_norm at 2.4 s a call spent 12 s more on it.
    """
    from sandbox.timing import HOST_LOOP_MS

    if not event_ms > 0:
        return runs
    return min(runs, max(1, math.ceil(HOST_LOOP_MS / event_ms)))


@contextlib.contextmanager
def raised_priority(proc: CandidateProcess) -> Iterator[None]:
    """Run the candidate's processes above everything else on the host for a while."""
    # Without root this fails: timing still works, only less steady on a busy host.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, proc.proc.pid, TIMED_NICE)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PGRP, proc.proc.pid, CANDIDATE_NICE)


# -- the candidate ------------------------------------------------------------------
def time_candidate(ctx: JobContext, proc: CandidateProcess, slowest_call_s: float) -> None:
    """Time the candidate: CUDA events per run, cross-checked by this process's clock.

    The candidate cannot patch this process's clock: a rigged event timer shows up
    as host time above the reported median, and then the host time counts. The
    outputs of both timed loops are checked afterwards. Each loop has the GPU to
    itself, for a lease its trials' pace bounds (TIMING_LEASE_S).
    """
    from sandbox.timing import reported_ms, summarize

    result, deadline = ctx.result, ctx.deadline
    problem = ctx.problem
    with ctx.shared(), ctx.stage("timing_io"):
        inputs = problem.make_inputs(ctx.base_seed + 3000)
        expected = problem.reference(inputs)
        stage_inputs(ctx, proc, inputs)
    runs, warmup = loop_sizes(
        slowest_call_s * 1e3, ctx.config.timing_runs, ctx.config.timing_warmup
    )
    lease_s = TIMING_LEASE_S + TIMING_LEASE_FACTOR * (runs + warmup + 1) * slowest_call_s
    walls: list[dict[str, Any]] = []
    median = spread = host_ms = 0.0
    with ctx.exclusive(), raised_priority(proc):
        try:
            with ctx.stage("timing.events"):
                events = proc.request(
                    min(deadline, time.monotonic() + lease_s),
                    cmd="time",
                    slot="events",
                    runs=runs,
                    warmup=warmup,
                )
            times = event_times(events, runs)
            if times:
                median, spread = summarize(times)
                with ctx.stage("timing.host"):
                    host_ms, walls = host_time(proc, median, runs, lease_s, deadline)
        except CandidateDied as death:
            if death.verdict == "timeout" and time.monotonic() < deadline:
                raise CandidateDied(
                    "timeout",
                    f"a timed loop ran past {lease_s:.1f} s, far longer than its "
                    f"correctness trials ({slowest_call_s:.3f} s per call) predict",
                ) from None
            raise
    for reply in (events, *walls):
        raise_failure(reply)
    for reply in (events, *walls):
        with contextlib.suppress(TypeError, ValueError):
            # As the candidate reports it: tells scheduling delays from the loop itself.
            add_stage(result, "timed_loops", max(0.0, float(reply.get("loop_s", 0.0))))
    if not times:
        raise Rejected("tampering", "the timing loop returned impossible measurements")
    with ctx.shared(), ctx.stage("timing_io"):
        for slot in ("events", "wall"):  # one at a time: one set of outputs held
            with ctx.exchange(proc) as exchange:
                specs = exchange.put(f"timed_{slot}_", expected, writable=True)
                fetched = proc.request(
                    deadline, fds=exchange.descriptors(), cmd="fetch", outputs={slot: specs}
                )
                if not fetched.get("ok"):
                    raise Rejected("runtime_error", str(fetched.get("message", ""))[:4000])
                outputs = [exchange.read(s) for s in specs]
                exchange.release(specs)  # the views hold their buffers until judged
            check_timed(ctx, inputs, expected, outputs)
            del outputs
    result.candidate_ms, result.retimed = reported_ms(median, host_ms)
    result.candidate_spread = spread
    result.timing_runs = runs


def host_time(
    proc: CandidateProcess, event_ms: float, runs: int, lease_s: float, deadline: float
) -> tuple[float, list[dict[str, Any]]]:
    """Milliseconds per call by this process's clock, and the candidate's replies.

    Back-to-back calls ending in a device-wide synchronisation, less one empty round
    trip. A loop lasts about `timing.HOST_LOOP_MS`, and the quickest of up to
    `timing.HOST_LOOP_REPEATS` loops counts (no more once one comes within
    `timing.HOST_LOOP_AGREE` of the events): a process descheduled during a request
    only ever adds to a loop, and on a busy host that came to milliseconds per call in
    a loop of a dozen runs.
    """
    from sandbox.timing import (
        HOST_LOOP_AGREE,
        HOST_LOOP_REPEATS,
        host_timed_runs,
        quickest_loop,
    )

    wall_runs = host_timed_runs(event_ms, runs)
    lease_s += TIMING_LEASE_FACTOR * wall_runs * event_ms / 1e3
    replies: list[dict[str, Any]] = []

    def loops() -> Iterator[float]:
        for _ in range(HOST_LOOP_REPEATS):
            started = time.perf_counter()
            proc.request(deadline, cmd="ping")
            round_trip = time.perf_counter() - started
            started = time.perf_counter()
            reply = proc.request(
                min(deadline, time.monotonic() + lease_s),
                cmd="time",
                slot="wall",
                runs=wall_runs,
                warmup=0,
                wall=True,
            )
            elapsed = time.perf_counter() - started - round_trip
            replies.append(reply)
            if not reply.get("ok"):
                return
            # The warm-up call plus `wall_runs` back-to-back calls.
            yield max(0.0, elapsed) * 1e3 / (wall_runs + 1)

    best = quickest_loop(event_ms, loops(), HOST_LOOP_AGREE)
    return (best if math.isfinite(best) else 0.0), replies


def stage_inputs(ctx: JobContext, proc: CandidateProcess, inputs: list[Any]) -> None:
    """Hand the candidate the inputs of the timed runs, outside the timing lock."""
    with ctx.exchange(proc) as exchange:  # the harness copies the staged inputs
        in_specs = exchange.put("in", inputs, writable=False)
        staged = proc.request(
            ctx.deadline, fds=exchange.descriptors(), cmd="stage", inputs=in_specs
        )
    raise_if_gpu_full(staged)
    if not staged.get("ok"):
        raise Rejected("runtime_error", str(staged.get("message", ""))[:4000])


def check_timed(
    ctx: JobContext,
    inputs: list[Any],
    expected: list[torch.Tensor],
    outputs: list[torch.Tensor],
) -> None:
    """A timed loop's outputs, judged as a trial's (its rounding allowance measured too).

    The timed inputs are new draws: a long reduction whose trials happened to pass
    without the allowance may need it here (a conv_transpose3d over 17k terms did).
    """
    comparisons = judgment.compare_outputs(
        ctx.entry, inputs, expected, outputs, ctx.atol, ctx.rtol, ctx.result
    )
    check = compare.combine(comparisons)
    if not check.passed:
        raise Rejected("wrong_output", f"wrong while being timed: {check.message}")


# -- the baselines ------------------------------------------------------------------
def baselines(
    job: Job,
    entry: ProblemEntry,
    result: VerifyResult,
    gate: GpuGate | None,
    clock: Any,
    runs: int,
    warmup: int,
) -> None:
    """Eager and torch.compile times for this problem: known, cached, or measured now."""
    for name, value in job.known_baselines.items():
        entry.baseline_ms.setdefault(name, value)
    wanted = [n for n in job.baselines if n not in entry.baseline_ms]
    if wanted:
        measure_baselines(entry, wanted, result, gate, clock, runs, warmup)
    result.eager_ms = entry.baseline_ms.get("eager") if "eager" in job.baselines else None
    result.compile_ms = (
        entry.baseline_ms.get("torch_compile") if "torch_compile" in job.baselines else None
    )


def measure_baselines(
    entry: ProblemEntry,
    names: list[str],
    result: VerifyResult,
    gate: GpuGate | None,
    clock: Any,
    runs: int,
    warmup: int,
) -> None:
    """Time the problem's reference (`eager`) and its torch.compile (`torch_compile`) with
    `clock`, `runs` timed calls after `warmup`, the GPU alone; None where one cannot run."""
    from sandbox.timing import (
        BASELINE_HOST_SLACK,
        HOST_LOOP_MS,
        HOST_LOOP_REPEATS,
        quickest_loop,
        summarize,
        time_cuda,
        time_wall,
    )

    problem = entry.problem
    seed = secrets.randbits(48)
    functions: dict[str, Any] = {"eager": problem.reference_fn}
    if "torch_compile" in names:
        # Compiling takes seconds of CPU: done before taking the GPU timing lock,
        # with only Inductor's autotuning (GPU work) under a shared hold of it.
        with stage(result, "baseline_compile"), torch.no_grad():
            try:
                compiled = torch.compile(problem.reference_fn)
                warm_up_compiled(compiled, problem, seed + 5000, gate, result)
                functions["torch_compile"] = compiled
            except Exception:  # noqa: BLE001 - reported as a missing baseline
                functions["torch_compile"] = None
    with exclusive_hold(gate, result), torch.no_grad():
        inputs = problem.make_inputs(seed + 3000)
        for name in names:
            fn = functions.get(name)
            value: float | None = None
            if fn is not None:
                try:
                    call = functools.partial(fn, *inputs)
                    n, n_warm = loop_sizes(time_wall(call, clock, 1), runs, warmup)
                    event_ms = summarize(time_cuda(call, clock, n, n_warm))[0]
                    host_runs = baseline_host_runs(event_ms, n)
                    # A loop past HOST_LOOP_MS is no longer one a delay distorts much, and
                    # repeating a 2.4 s call's check would cost seconds of exclusive GPU.
                    short = event_ms * host_runs <= HOST_LOOP_MS
                    loops = (
                        time_wall(call, clock, host_runs)
                        for _ in range(HOST_LOOP_REPEATS if short else 1)
                    )
                    host = quickest_loop(event_ms, loops, BASELINE_HOST_SLACK)
                    value = event_ms if host <= event_ms * (1 + BASELINE_HOST_SLACK) else host
                except Exception:  # noqa: BLE001 - a baseline that cannot run is missing
                    value = None
            entry.baseline_ms[name] = value


def warm_up_compiled(
    compiled: Any, problem: Problem, seed: int, gate: GpuGate | None, result: VerifyResult
) -> None:
    """The first call of a compiled baseline: compile unheld, GPU work under the gate."""
    from sandbox.inductor_gate import gated_autotuning

    with gated_autotuning(lambda: shared_hold(gate, result)) as gated:
        with shared_hold(gate, result):
            inputs = problem.make_inputs(seed)
        with contextlib.nullcontext() if gated else shared_hold(gate, result):
            compiled(*inputs)
        torch.cuda.synchronize()  # its kernels end before this grader times anything
