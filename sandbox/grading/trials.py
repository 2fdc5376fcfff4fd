"""Driving one candidate through the checks of DESIGN §4, call by call.

Load, the compile pass, then the correctness trials (fresh secret inputs each: outputs,
dtype, shape, NaN pattern, aliasing, mutation, caching) with one call among them, at a
secret place, where Triton's launches are turned off: its answer must be wrong. Every
call runs under the same conditions in the candidate's process (`sandbox.guard`: PyTorch
compute refused on each of them), so there is no separate checked call for a candidate to
recognise and behave for. Each call hands the candidate its tensors (`sandbox.transfer`),
waits for its reply, and judges what it left (`sandbox.grading.judgment`); anything wrong
is raised as `Rejected`.

What the candidate's harness reports is believed only where it rejects (a refusal, a
failure, zero launches, an output described as the wrong shape): acceptance rests on the
outputs in the grader's own buffers and on the no-launch call's answer, judged here.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import torch

from sandbox import compare, safe_fs
from sandbox.gpu_gate import SharedHold
from sandbox.grading import judgment
from sandbox.grading.gpu import CandidateOutOfMemory
from sandbox.grading.job import JobContext, Rejected
from sandbox.grading.stages import add_reported_stage
from sandbox.process import CandidateProcess
from sandbox.result import TrialOutcome, VerifyResult
from sandbox.transfer import Exchange

# A candidate call may hold its job's share of the GPU this long (`sandbox.gpu_gate`);
# past it the call goes on without, so a slow or hanging candidate holds up the timed
# loops of other jobs for this long at most.
SHARED_LEASE_S = 1.0
# Verdicts a candidate's harness may report for a failed call; any other kind of failure
# it names (`replies.ERROR_TYPES`) is read as a `runtime_error`: a `sandbox_error` is never
# the candidate's to claim.
HARNESS_VERDICTS = frozenset(
    {
        "runtime_error",
        "compile_error",
        "resource_limit",
        "torch_fallback",
        "no_triton_kernel",
        "tampering",
        "wrong_output",
    }
)
LOAD_VERDICTS = HARNESS_VERDICTS | {"no_entry_point"}
# The seed offset of the no-launch call's inputs (the trials' are 0..trials-1).
NO_LAUNCH_SEED = 2000
SOURCE_NAME = "candidate.py"


def load(ctx: JobContext, proc: CandidateProcess) -> None:
    """Hand the candidate's source to its process and have it imported (its set-up run)."""
    problem = ctx.problem
    # A name no one made yet (the harness ran in this directory, no candidate code yet).
    safe_fs.write_new(proc.dir_fd, SOURCE_NAME, ctx.job.candidate.encode())
    # Under a share of the GPU gate, like a trial: what the import runs on the GPU (the harness
    # waits for it before replying) never overlaps another job's timed loop or baselines.
    with ctx.shared() as hold, ctx.stage("load"):
        reply = proc.request(
            ctx.deadline,
            lease=(SHARED_LEASE_S, hold.overrun) if hold is not None and hold.held else None,
            cmd="load",
            path=f"{proc.job_dir}/{SOURCE_NAME}",
            format=problem.format,
            init_inputs=problem.init_inputs,
            init_seed=42,
            gpu_memory_bytes=ctx.candidate_gpu_bytes() if ctx.device == "cuda" else None,
        )
    raise_failure(reply, LOAD_VERDICTS)


def compile_pass(ctx: JobContext, proc: CandidateProcess) -> None:
    """Run the candidate once with launches that compile and load but run nothing.

    Its inputs are uninitialised device memory of the right shapes (nothing reads
    them), so this call puts no work on the GPU. Under the CPU interpreter there is
    nothing to compile and the call runs the host code alone: the same steps on
    both. A kernel that fails to compile is reported by the first trial (the
    compile launch keeps quiet); anything else the candidate does wrong on this
    call is judged like a trial's.
    """
    entry = ctx.entry
    if entry.input_layout is None:
        entry.input_layout = entry.problem.input_layout()
    reply = proc.request(
        ctx.deadline,
        cmd="run",
        inputs=entry.input_layout,
        outputs=[],
        inputs_after=[],
        mode="compile",
    )
    raise_failure(reply)


def no_launch_position(trials: int) -> int:
    """Where among the calls after the first trial the no-launch call goes (secret: the
    candidate cannot count calls to find it). Never first: by the second call every
    autotuner has tuned, so a skipped launch finds Triton's state as a real one would."""
    return 1 + secrets.randbelow(max(1, trials))


def run_trials(ctx: JobContext, proc: CandidateProcess) -> float:
    """The correctness trials, with the no-launch call among them; the slowest trial's
    seconds (of those after the first, which may autotune). Sets `result.kernel_launches`.
    """
    previous: list[tuple[Any, ...]] | None = None  # the last trial's output fingerprints
    launches = 0
    slowest_call = 0.0
    no_launch_at = no_launch_position(ctx.job.trials)
    for call in range(ctx.job.trials + 1):
        if call == no_launch_at:
            check_no_launch_call(ctx, proc)
            continue
        index = call - (call > no_launch_at)
        with ctx.shared() as hold:
            # On a GPU the reference is only queued here; `run_call` checks it (NaN/Inf)
            # with the same wait for the device that sends the inputs on.
            inputs, expected = _draw(ctx, ctx.base_seed + index)
            called = time.monotonic()
            with ctx.stage("first_trial" if index == 0 else "trials"):
                comparison, reply, fingerprints = run_call(
                    ctx, proc, inputs, expected, "normal", hold, check_reference=True
                )
            if index > 0 or ctx.job.trials == 1:
                slowest_call = max(slowest_call, time.monotonic() - called)
            check_trial(ctx.result, index, comparison, reply, fingerprints, previous)
            previous = fingerprints
            # Freed before the next trial draws its inputs: GiB tensors on a shared GPU.
            del inputs, expected
        launches = max(launches, int(reply.get("launches", 0)))
    ctx.result.kernel_launches = launches
    return slowest_call


def check_no_launch_call(ctx: JobContext, proc: CandidateProcess) -> None:
    """The call with Triton's launches turned off: handled like a trial (same command,
    same inputs handling, the same guard in the candidate's process), but its answer
    must be wrong. A right one did not come from the Triton kernels."""
    with ctx.shared() as hold:
        inputs, expected = _draw(ctx, ctx.base_seed + NO_LAUNCH_SEED)
        with ctx.stage("noop_check"):
            comparison, _, _ = run_call(
                ctx, proc, inputs, expected, "noop", hold, check_reference=True
            )
        del inputs, expected
    if comparison.passed:
        raise Rejected(
            "torch_fallback",
            "with every Triton launch turned off the output is still correct: "
            "the answer does not come from the Triton kernels",
        )


def _draw(ctx: JobContext, seed: int) -> tuple[list[Any], list[torch.Tensor]]:
    """A call's inputs and the reference's answer for them."""
    with ctx.stage("reference"):
        with ctx.stage("reference.draw"):
            inputs = ctx.problem.make_inputs(seed)
        expected = ctx.problem.reference(inputs)
    return inputs, expected


def run_call(
    ctx: JobContext,
    proc: CandidateProcess,
    inputs: list[Any],
    expected: list[torch.Tensor],
    mode: str,
    hold: SharedHold | None = None,
    check_reference: bool = False,
) -> tuple[compare.Comparison, dict[str, Any], list[tuple[Any, ...]]]:
    """One call of the candidate in `mode`: its comparison, reply, and its outputs'
    fingerprints (`judgment.fingerprint`; the outputs themselves are let go once judged).

    The grader waits for the device twice: before the command (the reference, with
    `check_reference` its NaN/Inf count, and the copies into the exchange) and for its
    judgment (the inputs as the candidate left them, every output's comparison and
    fingerprint, read back at once). Parts of the call's time go to `run.*` stages.
    """
    with ctx.exchange(proc) as exchange:
        return _run_call(ctx, proc, exchange, inputs, expected, mode, hold, check_reference)


def _run_call(
    ctx: JobContext,
    proc: CandidateProcess,
    exchange: Exchange,
    inputs: list[Any],
    expected: list[torch.Tensor],
    mode: str,
    hold: SharedHold | None,
    check_reference: bool,
) -> tuple[compare.Comparison, dict[str, Any], list[tuple[Any, ...]]]:
    """`run_call` with its exchange (closed by the caller: its files go with it)."""
    result = ctx.result
    with ctx.stage("run.exchange"):
        in_specs = exchange.put("in", inputs, writable=False)
        out_specs = exchange.put("out", expected, writable=True)
        # With files, the harness writes the inputs as the candidate left them into
        # blank ones (until it does they read as zeros: a reply forged without running
        # shows as a mutation). The no-launch call is handled the same way, so that
        # nothing in the command tells it from a trial. Shared memory needs no copy:
        # the candidate ran on it.
        after_specs = exchange.blanks(in_specs, "after")
        left_specs = after_specs or in_specs
        if check_reference:
            judgment.check_reference(expected, inputs)  # its read waits for the copies too
        fds = exchange.descriptors()
    with ctx.stage("run.round_trip"):
        reply = proc.request(
            ctx.deadline,
            lease=(SHARED_LEASE_S, hold.overrun) if hold is not None and hold.held else None,
            fds=fds,
            cmd="run",
            inputs=in_specs,
            outputs=out_specs,
            inputs_after=after_specs,
            mode=mode,
        )
    add_reported_stage(result, "run.harness", reply.get("harness_s"))
    add_reported_stage(result, "run.call", reply.get("call_s"))
    add_reported_stage(result, "run.inputs", reply.get("inputs_s"))
    add_reported_stage(result, "run.outputs", reply.get("outputs_s"))
    if mode != "normal":  # the no-launch call apart from the trials'
        add_reported_stage(result, f"run.{mode}.harness", reply.get("harness_s"))
    raise_failure(reply)
    with ctx.stage("run.judge"):
        # One input on the device at a time (a file is copied), compared there.
        changed = [
            (i, compare.differs(value.detach(), exchange.read(spec)))
            for i, (value, spec) in enumerate(zip(inputs, left_specs, strict=False))
            if isinstance(value, torch.Tensor) and value.numel()
        ]
        wrong = wrong_reply(reply, out_specs, len(expected))
        outputs = [] if wrong is not None else [exchange.read(spec) for spec in out_specs]
        exchange.release(out_specs)  # the outputs' views hold their buffers
        fingerprints = [judgment.fingerprint(t) for t in outputs] if mode == "normal" else []
        judged = wrong is None
        comparisons, flags = judgment.compare_all(
            expected if judged else [],
            outputs,
            ctx.atol,
            ctx.rtol,
            ctx.entry.noise if judged else None,
            also=tuple(flag for _, flag in changed),
        )
        # Released once read: dropping shared memory waits for the work on it.
        exchange.release(in_specs)
        mutated = [i for (i, _), flag in zip(changed, flags, strict=True) if flag]
        if mutated:
            raise Rejected("input_mutation", f"the candidate changed input(s) {mutated}")
        if wrong is not None:
            raise wrong
        # A no-op run is meant to miss: no reason to measure the reference's rounding.
        if mode != "noop":
            comparisons = judgment.allow_for_rounding(
                ctx.entry, inputs, expected, outputs, comparisons, ctx.atol, ctx.rtol, result
            )
    return compare.combine(comparisons), reply, fingerprints


def wrong_reply(
    reply: dict[str, Any], out_specs: list[dict[str, Any]], count: int
) -> Rejected | None:
    """What is wrong with the outputs the reply describes (None: they can be compared)."""
    if reply.get("count") != count:
        return Rejected("wrong_output", f"returned {reply.get('count')} outputs, expected {count}")
    for i, (info, spec) in enumerate(zip(reply["outputs"], out_specs, strict=True)):
        if info.get("type") != "Tensor":
            return Rejected(
                "wrong_output", f"output {i} is a {info.get('type')}, not a plain torch.Tensor"
            )
        if info.get("aliases_input"):
            return Rejected("wrong_output", f"output {i} is an input or a view of one")
        if info.get("shape") != spec["shape"]:
            return Rejected(
                "wrong_output",
                f"output {i} has shape {info.get('shape')}, expected {spec['shape']}",
            )
        if info.get("dtype") != spec["dtype"]:
            return Rejected(
                "wrong_output",
                f"output {i} has dtype {info.get('dtype')}, expected {spec['dtype']}",
            )
    return None


def check_trial(
    result: VerifyResult,
    index: int,
    comparison: compare.Comparison,
    reply: dict[str, Any],
    fingerprints: list[tuple[Any, ...]],
    previous: list[tuple[Any, ...]] | None,
) -> None:
    """Record one trial; reject a wrong or kernel-less one."""
    result.trials.append(
        TrialOutcome(
            index=index,
            passed=comparison.passed,
            max_abs_error=comparison.max_abs_error,
            max_rel_error=comparison.max_rel_error,
            mismatch_fraction=comparison.mismatch_fraction,
            message=comparison.message,
        )
    )
    if not comparison.passed:
        hint = ""
        if previous is not None and judgment.same_fingerprints(previous, fingerprints):
            hint = " (the same output as for the previous, different inputs: cached?)"
        raise Rejected("wrong_output", f"trial {index}: {comparison.message}{hint}")
    if reply.get("launches", 0) == 0:
        raise Rejected("no_triton_kernel", "no Triton kernel was launched")


def raise_if_gpu_full(reply: dict[str, Any]) -> None:
    """The candidate says an allocation under its cap failed for want of GPU memory: the
    grader decides from its own measure whose fault that is (`gpu.gpu_full_verdict`)."""
    if reply.get("error_type") == "gpu_full":
        # A claim until the grader confirms it (`gpu.gpu_full_verdict`, in the grader).
        raise CandidateOutOfMemory(str(reply.get("message", "")))


def raise_failure(reply: dict[str, Any], verdicts: frozenset[str] = HARNESS_VERDICTS) -> None:
    """Reject the candidate when its harness reports that a call failed (with the kind of
    failure it names, where that is one of `verdicts`)."""
    if reply.get("ok"):
        return
    raise_if_gpu_full(reply)
    verdict = reply.get("error_type", "runtime_error")
    if verdict not in verdicts:
        verdict = "runtime_error"
    raise Rejected(verdict, str(reply.get("message", ""))[:4000])


def check_log_cap(proc: CandidateProcess, file_mb: int) -> None:
    """Output past the cap is a broken candidate, even if it swallowed the write errors."""
    if proc.log_bytes() >= file_mb * 2**20:
        raise Rejected("resource_limit", f"wrote more than {file_mb} MiB to stdout/stderr")
