"""Timing on a GPU: the candidate's timed loops and the eager / torch.compile baselines.

The candidate times itself with CUDA events, cross-checked by this process's clock (a
rigged event timer shows up as host time above the reported median, and then the host
time counts). Its calls run on input sets staged ahead, a fresh one for each timed run
where they fit (`sandbox.timed_inputs`); after each loop this process draws some of the
calls whose outputs the harness kept, and judges them against the reference of the set
each ran on. Each timed loop, the candidate's or a baseline's, has the GPU to itself
(`gpu.exclusive_hold`), for a lease the candidate's correctness trials bound. Baselines
are measured once per problem, the same way, and count only where an idle probe read the
GPU idle before and after them (`sandbox.grading.idle`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sandbox import compare, timed_inputs
from sandbox.gpu_gate import GpuGate
from sandbox.grading import idle, judgment
from sandbox.grading.gpu import exclusive_hold, shared_hold
from sandbox.grading.idle import IdleProbe
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
# ... and the harness's copies of the input sets onto the device, one before each set's
# first call (from pageable host memory: counted at a slow host's pace).
COPY_IN_BYTES_PER_S = 1e9


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
def tensor_bytes(values: list[Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def time_candidate(ctx: JobContext, proc: CandidateProcess, slowest_call_s: float) -> str:
    """Time the candidate: CUDA events per run, cross-checked by this process's clock.
    Returns what the result should say about a loop short of the full plan ('' if none).

    Each call of a loop runs on one of several staged input sets, in rotation
    (`sandbox.timed_inputs`); after each loop this process draws some of the calls whose
    outputs the harness kept and judges them against their own set's reference. The
    candidate cannot patch this process's clock: a rigged event timer shows up as host
    time above the reported median, and then the host time counts. Each loop has the GPU
    to itself, for a lease its trials' pace bounds (TIMING_LEASE_S).
    """
    from sandbox.timing import reported_ms, summarize

    result, deadline, problem = ctx.result, ctx.deadline, ctx.problem
    runs, warmup = loop_sizes(
        slowest_call_s * 1e3, ctx.config.timing_runs, ctx.config.timing_warmup
    )
    with ctx.shared(), ctx.stage("timing_io"):
        first = problem.make_inputs(ctx.base_seed + 3000)
        expected = problem.reference(first)
        plan = timed_inputs.plan_timing(tensor_bytes(first), tensor_bytes(expected), runs, warmup)
        draws = [first] + [
            problem.make_inputs(ctx.base_seed + 3000 + j) for j in range(1, plan.sets)
        ]
        staged, layout = timed_inputs.pack(draws, first_device(first, ctx.device))
        del draws, first
        stage_inputs(ctx, proc, staged, layout)
    outputs = [{"shape": list(t.shape), "dtype": dtype_name(t)} for t in expected]
    del expected
    lease_s = TIMING_LEASE_S + TIMING_LEASE_FACTOR * (plan.runs + warmup + 1) * slowest_call_s
    lease_s += staged.numel() * staged.element_size() / COPY_IN_BYTES_PER_S
    walls: list[dict[str, Any]] = []
    chosen: dict[str, list[int]] = {}
    median = spread = host_ms = 0.0
    times: list[float] = []
    with ctx.exclusive(), raised_priority(proc):
        try:
            with ctx.stage("timing.events"):
                events = proc.request(
                    min(deadline, time.monotonic() + lease_s),
                    cmd="time",
                    slot="events",
                    runs=plan.runs,
                    warmup=plan.warmup,
                    wall=False,
                    schedule=plan.schedule(plan.warmup + plan.runs),
                    keep=plan.keep,
                    outputs=outputs,
                )
            times = event_times(events, plan.runs)
            if times:
                median, spread = summarize(times)
                # Drawn now the loop is over; the rest of its outputs are let go.
                calls = plan.warmup + plan.runs
                chosen["events"] = timed_inputs.picks(timed_inputs.kept_calls(calls, plan.keep))
                keep_only(ctx, proc, "events", chosen["events"])
                with ctx.stage("timing.host"):
                    host_ms, walls, wall_calls = host_time(
                        proc, median, plan, outputs, lease_s, deadline
                    )
                if wall_calls:
                    kept = timed_inputs.kept_calls(wall_calls, min(plan.wall_keep, wall_calls))
                    chosen["wall"] = timed_inputs.picks(kept)
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
        check_picks(ctx, proc, plan, staged, layout, chosen)
    result.candidate_ms, result.retimed = reported_ms(median, host_ms)
    result.candidate_spread = spread
    result.timing_runs = plan.runs
    return plan.note


def first_device(values: list[Any], default: str) -> Any:
    """The device of the first tensor among `values` (the problem's own), else `default`."""
    return next((v.device for v in values if isinstance(v, torch.Tensor)), default)


def dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def keep_only(ctx: JobContext, proc: CandidateProcess, slot: str, calls: list[int]) -> None:
    """Have the harness let go of the loop's outputs but those of `calls` (its memory back
    before the next loop)."""
    reply = proc.request(ctx.deadline, cmd="fetch", outputs={}, calls={}, keep={slot: calls})
    raise_failure(reply)


def check_picks(
    ctx: JobContext,
    proc: CandidateProcess,
    plan: timed_inputs.TimingPlan,
    staged: torch.Tensor,
    layout: list[list[dict[str, Any]]],
    chosen: dict[str, list[int]],
) -> None:
    """Fetch each picked call's outputs and judge them against the reference of the set it
    ran on (one set's reference, and one call's outputs, held at a time)."""
    picked = sorted(
        (plan.set_of(call, wall=slot == "wall"), slot, call)
        for slot, calls in chosen.items()
        for call in calls
    )
    reference_of: tuple[int, list[Any], list[torch.Tensor]] | None = None
    for index, slot, call in picked:
        if reference_of is None or reference_of[0] != index:
            reference_of = None  # one reference at a time
            inputs = timed_inputs.unpack(staged, [layout[index]])[0]
            reference_of = (index, inputs, ctx.problem.reference(inputs))
        _, inputs, expected = reference_of
        with ctx.exchange(proc) as exchange:
            specs = exchange.put(f"timed_{slot}_", expected, writable=True)
            fetched = proc.request(
                ctx.deadline,
                fds=exchange.descriptors(),
                cmd="fetch",
                outputs={slot: specs},
                calls={slot: call},
                keep={},
            )
            raise_failure(fetched)
            outputs = [exchange.read(s) for s in specs]
            exchange.release(specs)  # the views hold their buffers until judged
        check_timed(ctx, inputs, expected, outputs, f"{slot} loop call {call}")
        del outputs, inputs, expected


def host_time(
    proc: CandidateProcess,
    event_ms: float,
    plan: timed_inputs.TimingPlan,
    outputs: list[dict[str, Any]],
    lease_s: float,
    deadline: float,
) -> tuple[float, list[dict[str, Any]], int]:
    """Milliseconds per call by this process's clock, the candidate's replies, and the calls
    of each host-clock loop (0 if none ran to its end).

    Back-to-back calls ending in a device-wide synchronisation, less one empty round
    trip; the clock stops at the harness's mark of the loop's end, before the guard's
    checks of the stretch (a fixed few milliseconds, which 550 calls of a 0.18 ms kernel
    read as 5% more time each). A loop lasts about `timing.HOST_LOOP_MS`, and the quickest of up to
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

    wall_runs = host_timed_runs(event_ms, plan.runs)
    lease_s += TIMING_LEASE_FACTOR * wall_runs * event_ms / 1e3
    replies: list[dict[str, Any]] = []

    def loops() -> Iterator[float]:
        for _ in range(HOST_LOOP_REPEATS):
            started = time.perf_counter()
            proc.request(deadline, cmd="ping")
            round_trip = time.perf_counter() - started
            ended: list[float] = []
            started = time.perf_counter()
            reply = proc.request(
                min(deadline, time.monotonic() + lease_s),
                on_mark=functools.partial(stamp, ended),
                cmd="time",
                slot="wall",
                runs=wall_runs,
                warmup=0,
                wall=True,
                schedule=plan.schedule(wall_runs + 1, wall=True),
                keep=plan.wall_keep,
                outputs=outputs,
            )
            # Up to the harness's mark of the loop's end (the guard's checks of the stretch
            # after it are the harness's, not the candidate's), else up to the reply.
            stopped = ended[0] if ended else time.perf_counter()
            elapsed = stopped - started - round_trip
            replies.append(reply)
            if not reply.get("ok"):
                return
            # The warm-up call plus `wall_runs` back-to-back calls.
            yield max(0.0, elapsed) * 1e3 / (wall_runs + 1)

    best = quickest_loop(event_ms, loops(), HOST_LOOP_AGREE)
    finished = bool(replies) and bool(replies[-1].get("ok"))
    return (best if math.isfinite(best) else 0.0), replies, (wall_runs + 1 if finished else 0)


def stamp(into: list[float]) -> None:
    """Note this process's clock now (a loop mark's arrival)."""
    into.append(time.perf_counter())


def stage_inputs(
    ctx: JobContext,
    proc: CandidateProcess,
    staged: torch.Tensor,
    layout: list[list[dict[str, Any]]],
) -> None:
    """Hand the candidate the input sets of the timed runs (packed in one buffer, with their
    layout), outside the timing lock."""
    with ctx.exchange(proc) as exchange:  # the harness copies (or maps) the staged buffer
        in_specs = exchange.put("in", [staged], writable=False)
        reply = proc.request(
            ctx.deadline,
            fds=exchange.descriptors(),
            cmd="stage",
            inputs=in_specs,
            layout=layout,
            spans=timed_inputs.set_spans(layout),  # worked out here, not by the candidate
        )
    raise_if_gpu_full(reply)
    if not reply.get("ok"):
        raise Rejected("runtime_error", str(reply.get("message", ""))[:4000])


def check_timed(
    ctx: JobContext,
    inputs: list[Any],
    expected: list[torch.Tensor],
    outputs: list[torch.Tensor],
    which: str = "",
) -> None:
    """A timed call's outputs, judged as a trial's (its rounding allowance measured too).

    The timed inputs are new draws: a long reduction whose trials happened to pass
    without the allowance may need it here (a conv_transpose3d over 17k terms did).
    """
    comparisons = judgment.compare_outputs(
        ctx.entry, inputs, expected, outputs, ctx.atol, ctx.rtol, ctx.result
    )
    check = compare.combine(comparisons)
    if not check.passed:
        where = f" ({which})" if which else ""
        raise Rejected("wrong_output", f"wrong while being timed{where}: {check.message}")


# -- the baselines ------------------------------------------------------------------
def baselines(
    job: Job,
    entry: ProblemEntry,
    result: VerifyResult,
    gate: GpuGate | None,
    clock: Any,
    runs: int,
    warmup: int,
    probe: IdleProbe | None = None,
    settle: Callable[[], None] = lambda: None,
) -> None:
    """Eager and torch.compile times for this problem: known, cached, or measured now."""
    for name, value in job.known_baselines.items():
        entry.baseline_ms.setdefault(name, value)
    wanted = [n for n in job.baselines if n not in entry.baseline_ms]
    if wanted:
        measure_baselines(
            entry, wanted, result, gate, clock, runs, warmup, probe=probe, settle=settle
        )
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
    probe: IdleProbe | None = None,
    settle: Callable[[], None] = lambda: None,
) -> None:
    """Time the problem's reference (`eager`) and its torch.compile (`torch_compile`) with
    `clock`, `runs` timed calls after `warmup`, the GPU alone; None where one cannot run.

    With an idle `probe` (`sandbox.grading.idle`), the measurement counts only when the GPU
    read idle before and after it; otherwise it is taken again (after `settle()`, which ends
    this grader's finished candidates), and if the GPU never read idle the baselines are
    left unmeasured (not cached: the next job of the problem tries again).
    """
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

    def measure() -> dict[str, float | None]:
        with torch.no_grad():
            return time_baselines(problem, names, functions, clock, runs, warmup, seed + 3000)

    measured = idle.measure_while_idle(
        probe,
        measure,
        hold=lambda: exclusive_hold(gate, result),
        settle=settle,
        sleep=time.sleep,
        note=lambda name, seconds: add_stage(result, name, seconds),
    )
    if measured is None:
        print(
            f"sandbox: no baselines measured: the GPU was busy with other work through "
            f"{idle.BASELINE_ATTEMPTS} tries (probe {probe.idle_ms if probe else 0:.3f} ms idle)",
            file=sys.stderr,
        )
        return
    entry.baseline_ms.update(measured)


def time_baselines(
    problem: Problem,
    names: list[str],
    functions: dict[str, Any],
    clock: Any,
    runs: int,
    warmup: int,
    seed: int,
) -> dict[str, float | None]:
    """Each baseline (None where it cannot run), timed as a candidate is: its calls rotate
    over input sets staged the same way (`timed_inputs`), the events cross-checked by the
    host clock."""
    first = problem.make_inputs(seed)
    values: dict[str, float | None] = {}
    for name in names:
        fn = functions.get(name)
        try:
            values[name] = (
                None if fn is None else time_baseline(problem, fn, first, clock, runs, warmup, seed)
            )
        except Exception:  # noqa: BLE001 - a baseline that cannot run is missing
            values[name] = None
    return values


def time_baseline(
    problem: Problem,
    fn: Callable[..., Any],
    first: list[Any],
    clock: Any,
    runs: int,
    warmup: int,
    seed: int,
) -> float:
    """Milliseconds per call of `fn`, its first input set `first` (drawn from `seed`)."""
    from sandbox.timing import (
        BASELINE_HOST_SLACK,
        HOST_LOOP_MS,
        HOST_LOOP_REPEATS,
        quickest_loop,
        summarize,
        time_cuda,
        time_wall,
    )

    sizes: list[int] = []  # the output's bytes, read off the call that sizes the loop

    def sized() -> None:
        out = fn(*first)
        sizes[:] = [tensor_bytes(list(out) if isinstance(out, list | tuple) else [out])]

    n, n_warm = loop_sizes(time_wall(sized, clock, 1), runs, warmup)
    out_bytes = sizes[0] if sizes else 0
    plan = timed_inputs.plan_timing(tensor_bytes(first), out_bytes, n, n_warm)
    draws = [first] + [problem.make_inputs(seed + j) for j in range(1, plan.sets)]
    staged, layout = timed_inputs.pack(draws, first_device(first, "cuda"))
    sets = timed_inputs.unpack(staged, layout)
    del draws

    def rotating(calls: int, wall: bool = False) -> Callable[[], Any]:
        """The calls on their sets, in the order the candidate's loop has them."""
        next_set = iter([sets[i] for i in plan.schedule(calls, wall)]).__next__
        return lambda: fn(*next_set())

    calls = plan.warmup + plan.runs
    event_ms = summarize(time_cuda(rotating(calls), clock, plan.runs, plan.warmup))[0]
    host_runs = baseline_host_runs(event_ms, plan.runs)
    # A loop past HOST_LOOP_MS is no longer one a delay distorts much, and repeating a
    # 2.4 s call's check would cost seconds of exclusive GPU.
    short = event_ms * host_runs <= HOST_LOOP_MS
    loops = (
        time_wall(rotating(host_runs + 1, wall=True), clock, host_runs)
        for _ in range(HOST_LOOP_REPEATS if short else 1)
    )
    host = quickest_loop(event_ms, loops, BASELINE_HOST_SLACK)
    return event_ms if host <= event_ms * (1 + BASELINE_HOST_SLACK) else host


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
