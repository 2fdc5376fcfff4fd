"""The grader: judges one job at a time, in a process that runs no candidate code.

For each job it loads the (trusted) problem, draws fresh inputs from secret seeds,
computes the references, and drives a fresh jailed candidate process through the
checks of DESIGN §4: load, correctness trials (outputs, dtype, shape, NaN,
aliasing, mutation, caching), the PyTorch-fallback check with compute poisoned,
the converse check with Triton launches turned off, then timing against eager
PyTorch and torch.compile on a GPU. All comparisons happen here.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
import platform
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from sandbox import compare, device_share
from sandbox.config import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    DEFAULT_TRIALS,
    KERNELBENCH_ATOL,
    KERNELBENCH_RTOL,
    SandboxConfig,
)
from sandbox.gpu_budget import GIB, BudgetTimeout, GpuMemoryBudget, estimate_gib
from sandbox.gpu_gate import GpuGate, SharedHold
from sandbox.isolation import Limits, hand_over
from sandbox.launchers import LauncherCache
from sandbox.problem import Problem, ProblemError, load_problem, source_key
from sandbox.process import CandidateDied, CandidateProcess, candidate_env
from sandbox.result import TrialOutcome, VerifyResult
from sandbox.static_checks import static_verdict
from sandbox.timing import L2_FLUSH_BYTES
from sandbox.transfer import Exchange
from sandbox.zygote import CANDIDATE_NICE, TIMED_NICE, Zygote, ZygoteError

SANDBOX_VERSION = "0.1.0"
PROCESS_START_BUDGET_S = 120.0
# A candidate call may hold its job's share of the GPU this long (`sandbox.gpu_gate`);
# past it the call goes on without, so a slow or hanging candidate holds up the timed
# loops of other jobs for this long at most.
SHARED_LEASE_S = 1.0
# A timed loop waits this long at most for calls past their lease to end: they still run
# on the GPU (`GpuGate.exclusive`). In an 8-worker run of GiB programs, where slow
# candidates overran their leases, the timed loops of memory-bound kernels spread by
# 5-18% (about 1% alone): the GPU work a timed loop did not yet keep out.
OVERRUN_WAIT_S = 20.0
# A timed loop has the GPU alone for at most this long, plus TIMING_LEASE_FACTOR times
# what its runs would take at the pace of the slowest correctness trial; a loop that
# overruns that is killed (a `timeout`): it was not the kernel its trials showed.
TIMING_LEASE_S = 5.0
TIMING_LEASE_FACTOR = 3.0
# At most this fraction of a reference's values may be NaN or Inf (`_check_reference`),
# or STRAY_DRAWS stray input values' worth, where a small input is broadcast over the
# output (an exact 0.0 in a [3968, 148, 1] divisor is a row of 1,827 Infs), within
# NONFINITE_CAP of the output.
NONFINITE_LIMIT = 1e-6
STRAY_DRAWS = 2
NONFINITE_CAP = 1e-3
MEMORY_QUERY_S = 2.0  # how long a finished job waits for its candidate's memory figures


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
class _ProblemEntry:
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


# GPU memory a grader may keep between jobs (its clock's buffers, library workspaces).
RETAINED_GPU_BYTES = GIB
# Up to this much the allocator's cache stays after a job (the clock's 256 MiB flush buffer
# included): the next job's small tensors reuse its blocks, where giving them back and
# allocating again would wait on the driver, busy creating candidates' CUDA contexts.
KEPT_CACHE_BYTES = 512 * 2**20


def _event_times(reply: dict[str, Any], runs: int) -> list[float]:
    """The timed loop's event times; empty when it failed or sent impossible ones."""
    if not reply.get("ok"):
        return []
    try:
        times = [float(t) for t in reply.get("times", [])]
    except (TypeError, ValueError):
        return []
    return times if len(times) == runs and all(t > 0 for t in times) else []


def _loop_sizes(per_call_ms: float, runs: int, warmup: int) -> tuple[int, int]:
    """Timed runs and warm-up calls for a call this slow (`timing.runs_within_budget`)."""
    from sandbox.timing import runs_within_budget

    timed = runs_within_budget(per_call_ms, runs)
    return timed, warmup if timed == runs else min(warmup, 1)


def _baseline_host_runs(event_ms: float, runs: int) -> int:
    """Runs of a baseline's host-clock check: about `timing.HOST_LOOP_MS` of them.

    PyTorch's own code needs no guard against a rigged timer, only a check that its events
    saw all its work: a whole-tensor layer_norm at 2.4 s a call spent 12 s more on it.
    """
    from sandbox.timing import HOST_LOOP_MS

    if not event_ms > 0:
        return runs
    return min(runs, max(1, math.ceil(HOST_LOOP_MS / event_ms)))


def _compare_all(
    expected: list[torch.Tensor],
    outputs: list[torch.Tensor],
    atol: float,
    rtol: float,
    noise: list[compare.Allowance] | None,
    also: tuple[torch.Tensor, ...] = (),
) -> tuple[list[compare.Comparison], list[float]]:
    """Outputs against references, each within its allowance for the reference's own error;
    and the values of the device scalars `also`. One read from the device for all."""
    allowances = noise or [compare.Allowance()] * len(expected)
    pending = [
        compare.measure(ref, got, atol + extra.atol, rtol, extra.allowed(ref.numel()))
        for ref, got, extra in zip(expected, outputs, allowances, strict=True)
    ]
    measured, values = compare.conclude(pending, *also)
    comparisons = []
    for comparison, extra in zip(measured, allowances, strict=True):
        if extra.atol and not comparison.passed:
            note = f" (atol {atol:g} + {extra.atol:.3g} for the reference's own float32 rounding)"
            comparison = replace(comparison, message=comparison.message + note)
        comparisons.append(comparison)
    return comparisons, values


# Below this many bytes the reference and outputs stay on the GPU while the float64
# reference runs (`_parked`): moving them costs more than the room it makes.
PARK_MIN_BYTES = 1 << 28


@contextlib.contextmanager
def _parked(*groups: list[Any]) -> Iterator[None]:
    """The GPU tensors of these lists moved to host memory for the block, their device
    memory freed (where nothing else holds them), then moved back: room for the float64
    reference of a GiB problem beside nothing but itself."""
    moved = [
        (group, i, value.device)
        for group in groups
        for i, value in enumerate(group)
        if isinstance(value, torch.Tensor) and value.device.type == "cuda"
    ]
    if sum(g[i].numel() * g[i].element_size() for g, i, _ in moved) < PARK_MIN_BYTES:
        moved = []
    for group, i, _ in moved:
        group[i] = group[i].cpu()
    try:
        yield
    finally:
        for group, i, device in moved:
            group[i] = group[i].to(device)


def _nudged_reference(problem: Problem, inputs: list[Any], device: str | None) -> list[Any] | None:
    """The float64 reference on inputs `compare.nudged` (None: no room, or it failed);
    on the host where the GPU has no room for it beside the first float64 run."""
    for where in (device, "cpu") if device is None else (device,):
        try:
            moved = problem.reference_float64([compare.nudged(x) for x in inputs], device=where)
        except torch.cuda.OutOfMemoryError:
            moved = None  # handled outside: the error's frames hold GPU memory
        except Exception:  # noqa: BLE001 - no memory, or as the first float64 run: no allowance
            return None
        if isinstance(moved, list):
            return moved
        torch.cuda.empty_cache()
    return None


@contextlib.contextmanager
def _widened_in_place(values: list[Any]) -> Iterator[None]:
    """The floating-point tensors of `values` replaced by float64 copies for the block, one
    at a time (each original freed as its copy is made, where nothing else holds it), and
    narrowed back after: exact both ways. A tensor given twice stays one tensor."""
    first: dict[int, int] = {}  # id of a tensor -> the index where it first appears
    # (A comprehension: no loop variable left holding a float32 tensor.)
    dtypes = {
        i: (first.setdefault(id(value), i), value.dtype)
        for i, value in enumerate(values)
        if isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    }
    for i, (origin, _) in dtypes.items():
        values[i] = values[i].double() if origin == i else values[origin]
    try:
        yield
    finally:
        for i, (origin, dtype) in dtypes.items():
            values[i] = values[i].to(dtype) if origin == i else values[origin]


class Rejected(Exception):
    def __init__(self, verdict: str, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def provenance(device: str) -> dict[str, Any]:
    import triton

    info: dict[str, Any] = {
        "device": "cpu",
        "driver": "",
        "torch_version": torch.__version__,
        "triton_version": triton.__version__,
        "python_version": platform.python_version(),
        "sandbox_version": SANDBOX_VERSION,
        "hostname": socket.gethostname(),
        "interpreter": device == "cpu",
    }
    if device == "cuda":
        info["device"] = torch.cuda.get_device_name()
        try:
            import subprocess

            info["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                .stdout.split("\n")[0]
                .strip()
            )
        except (OSError, subprocess.SubprocessError):
            info["driver"] = f"cuda {torch.version.cuda}"
    return info


def candidate_gpu_bytes(io_bytes: int) -> int:
    """A candidate's GPU memory cap: 3x the problem's I/O (at least 2 GiB), plus the
    timing clock's L2 flush buffer, which lives in the candidate's allocator too.

    A timed candidate holds its inputs and up to three sets of outputs; the rest is
    room for the intermediate tensors of a multi-kernel translation. (Without the flush
    buffer's share, a conv_transpose3d + group_norm translation, its intermediate as
    large as its 642 MiB output, ran out of its cap in a timed loop.)
    """
    return max(2 * GIB, 3 * io_bytes) + L2_FLUSH_BYTES


def job_gpu_gib(io_bytes: int) -> int:
    """GiB a job reserves: the grader's copies (inputs, reference, the candidate's
    outputs read back: about twice the I/O) plus all its candidate may take."""
    # What bounds the grader's own peak (`gpu_memory_gib["grader_peak"]`, allocator and
    # shared buffers at one moment): during a candidate call, its private inputs, their
    # copy in the exchange, the reference and the output buffers: 2x the I/O; comparisons
    # and the mutation check add at most `compare.CHUNK_ELEMENTS` x 28 bytes (224 MiB).
    # In the one job per grader and problem that measures the rounding allowance, the
    # float64 reference alone: twice the float32 reference's own peak (inputs, outputs and
    # intermediates), with the reference and the outputs parked in host memory and the
    # inputs widened in place (`Grader._allow_for_rounding`). Size this from GPU runs.
    return estimate_gib(2 * io_bytes + candidate_gpu_bytes(io_bytes), factor=1.0)


def gpu_budget_gib(workers: int) -> int:
    """GiB the graders may reserve: 90% of the GPU less every process's CUDA context."""
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    contexts = 3 * workers  # a grader, its candidate and the next one: about 1 GiB each
    return max(1, int(0.9 * total) - contexts)


# Stages in which a job waits for other jobs (GPU memory, the GPU gate), not for its kernel.
WAIT_STAGES = ("gpu_memory_wait", "gpu_wait", "timing_wait", "timing_overrun_wait")


def _death_verdict(death: CandidateDied, result: VerifyResult, budget_s: float) -> tuple[str, str]:
    """A timeout of a job that spent most of its budget waiting for others is the
    sandbox's (`sandbox_error`, which clients retry), not the kernel's."""
    waited = sum(result.stage_seconds.get(name, 0.0) for name in WAIT_STAGES)
    if death.verdict != "timeout" or waited < budget_s / 2:
        return death.verdict, death.message
    return "sandbox_error", (
        f"the job ran out of time after waiting {waited:.0f} s of its {budget_s:.0f} s budget "
        f"for GPU memory or the GPU (a busy sandbox, not the kernel): {death.message}"
    )


def _add_stage(result: VerifyResult, name: str, seconds: float) -> None:
    result.stage_seconds[name] = result.stage_seconds.get(name, 0.0) + seconds


@contextlib.contextmanager
def _stage(result: VerifyResult, name: str) -> Iterator[None]:
    """Add the wall time of the block to `result.stage_seconds[name]`; an out-of-memory
    error leaving it is marked with the stage (the innermost), for the job's message."""
    started = time.monotonic()
    try:
        yield
    except torch.cuda.OutOfMemoryError as err:
        if not getattr(err, "__notes__", None):
            err.add_note(f"in the grader's {name} stage")
        raise
    finally:
        _add_stage(result, name, time.monotonic() - started)


@contextlib.contextmanager
def _raised_priority(proc: CandidateProcess) -> Iterator[None]:
    """Run the candidate's processes above everything else on the host for a while."""
    # Without root this fails: timing still works, only less steady on a busy host.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, proc.proc.pid, TIMED_NICE)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PGRP, proc.proc.pid, CANDIDATE_NICE)


def _fingerprint(tensor: torch.Tensor) -> tuple[Any, ...]:
    """A cheap summary that tells two outputs apart (for the "cached?" hint only).

    Left on the device: it is read back only when a trial fails (`_same_fingerprints`).
    """
    flat = tensor.detach().reshape(-1)
    step = max(1, flat.numel() // 4096)
    total = torch.sum(flat, dtype=torch.float64)  # 0 when empty
    return tuple(tensor.shape), str(tensor.dtype), total, flat[::step].clone()


def _same_fingerprints(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Whether two trials' outputs have the same fingerprints (NaN sums match as text)."""
    if [f[:2] for f in a] != [f[:2] for f in b]:
        return False
    totals = compare.host_values([f[2] for f in (*a, *b)])
    if [repr(t) for t in totals[: len(a)]] != [repr(t) for t in totals[len(a) :]]:
        return False
    return all(
        x[3].cpu().view(torch.uint8).numpy().tobytes()
        == y[3].cpu().view(torch.uint8).numpy().tobytes()
        for x, y in zip(a, b, strict=True)
    )


def _add_reported_stage(result: VerifyResult, name: str, seconds: Any) -> None:
    """Add seconds the candidate's harness reports (never trusted: diagnosis only)."""
    with contextlib.suppress(TypeError, ValueError):
        value = float(seconds)
        if math.isfinite(value) and value > 0:
            _add_stage(result, name, value)


class Grader:
    def __init__(self, config: SandboxConfig, device: str) -> None:
        self.config = config
        self.device = device
        self.limits = Limits(
            cpu_s=config.candidate_cpu_s,
            file_mb=config.candidate_output_mb,
            memory_mb=config.candidate_memory_mb,
            use_address_space_limit=device == "cpu",
        )
        os.makedirs(config.job_root, exist_ok=True)
        self.workdir = os.path.join(config.job_root, f"grader-{os.getpid()}")
        os.makedirs(self.workdir, exist_ok=True)
        self.problems: OrderedDict[str, _ProblemEntry] = OrderedDict()
        # Candidate processes started ahead, oldest first (`SandboxConfig.spares`).
        self.spares: deque[CandidateProcess] = deque()
        self._reapers: list[threading.Thread] = []  # finishing off ended candidates
        self.zygote: Zygote | None = None
        self.clock = None
        self.provenance = provenance(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.gpu_budget: GpuMemoryBudget | None = None
        self.launchers: LauncherCache | None = None
        self.gate: GpuGate | None = None
        # Tensors cross to candidates in shared device memory where the driver allows.
        self.share_memory = False
        if device == "cuda":
            self.launchers = LauncherCache(os.path.join(config.job_root, "launchers"))
            from sandbox.timing import bind_clock

            self.gate = GpuGate(config.job_root)
            with self.gate.exclusive():  # the spin rate, measured with the GPU to itself
                self.clock = bind_clock()
            why_not = device_share.available()  # after PyTorch has made its CUDA context
            self.share_memory = why_not is None
            if why_not is not None:
                print(
                    f"drtriton sandbox: tensors go through files (no shared GPU memory: {why_not})",
                    file=sys.stderr,
                )
            self.gpu_budget = GpuMemoryBudget(
                os.path.join(config.job_root, "gpu-memory.budget"),
                gpu_budget_gib(config.workers),
            )
            device_share.track_with_allocator()  # the job's peaks (`_note_gpu_memory`)

    # -- candidate processes ------------------------------------------------------
    def _zygote_alive(self) -> Zygote:
        """This grader's fork server, started again if it died."""
        if self.zygote is None or not self.zygote.alive:
            if self.zygote is not None:
                self.zygote.close()
            home = os.path.join(self.workdir, "zygote")
            os.makedirs(home, exist_ok=True)
            arch = None
            if self.device == "cuda":
                major, minor = torch.cuda.get_device_capability()
                arch = 10 * major + minor
            self.zygote = Zygote(self.device, candidate_env(home, self.device), arch)
        return self.zygote

    def _new_process(self) -> CandidateProcess:
        try:
            return self._spawn()
        except ZygoteError:
            # One more try with a fresh zygote; a second failure is the host's problem.
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None
            return self._spawn()

    def _spawn(self) -> CandidateProcess:
        return CandidateProcess(
            self._zygote_alive(),
            self.config.job_root,
            self.device,
            self.limits,
            self.launchers,
            self.clock.cycles_per_us if self.clock is not None else None,
        )

    def prestart(self) -> None:
        """Start candidate processes until `config.spares` are on their way."""
        while len(self.spares) < max(1, self.config.spares):
            self.spares.append(self._new_process())

    def take_process(self) -> CandidateProcess:
        """This job's process, the oldest spare; the next one starts now, while this job is
        graded."""
        proc = None
        while self.spares and proc is None:
            proc = self.spares.popleft()
            if proc.proc.poll() is not None:  # e.g. killed with its zygote
                proc.close()
                proc = None
        if proc is None:
            proc = self._new_process()
        self.prestart()
        return proc

    def close(self) -> None:
        for thread in self._reapers:
            thread.join(timeout=30)
        self._reapers = []
        while self.spares:
            self.spares.popleft().close()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def _reserve_gpu(
        self,
        entry: _ProblemEntry,
        deadline: float,
        result: VerifyResult,
        held: contextlib.ExitStack,
    ) -> None:
        """Hold this job's share of the GPU's memory until `held` closes (`sandbox.gpu_budget`)."""
        if self.gpu_budget is None:
            return
        gib = job_gpu_gib(entry.io())
        result.gpu_memory_gib.update(io=entry.io() / GIB, reserved=float(gib))
        with _stage(result, "gpu_memory_wait"):
            held.enter_context(self.gpu_budget.reserve(gib, deadline))

    def _candidate_gpu_bytes(self, entry: _ProblemEntry) -> int | None:
        """The GPU memory a candidate may take: room for its inputs, outputs and temporaries."""
        if self.device != "cuda":
            return None
        return candidate_gpu_bytes(entry.io())

    # -- problems -----------------------------------------------------------------
    def _problem(self, job: Job) -> _ProblemEntry:
        key = source_key(job.problem + job.format)
        entry = self.problems.get(key)
        if entry is None:
            entry = _ProblemEntry(load_problem(job.problem, job.format, self.device, self.workdir))
            self.problems[key] = entry
            while len(self.problems) > 64:
                self.problems.popitem(last=False)
        self.problems.move_to_end(key)
        return entry

    def _degenerate(self, entry: _ProblemEntry, atol: float, rtol: float) -> str:
        """Why a constant answer could pass (cached per problem); one perturbed run at a time."""
        if entry.degenerate is None:
            problem = entry.problem
            inputs = problem.make_inputs(1234)
            outputs = problem.reference(inputs)
            fresh = problem.make_inputs(4321)

            def perturbed() -> Iterator[tuple[int, list[torch.Tensor]]]:
                for j, value in enumerate(inputs):
                    if isinstance(value, torch.Tensor) and value.is_floating_point():
                        yield j, problem.reference([*inputs[:j], fresh[j], *inputs[j + 1 :]])

            entry.degenerate = compare.degenerate_reason(outputs, perturbed(), atol, rtol)
        return entry.degenerate

    # -- the job ------------------------------------------------------------------
    def grade(self, job: Job) -> VerifyResult:
        started = time.monotonic()
        deadline = started + job.budget_s
        result = VerifyResult(verdict="correct", request_id=job.request_id)
        if self.device == "cuda":  # this job's peaks, for `gpu_memory_gib`
            device_share.held_bytes_peak(reset=True)
            device_share.created_bytes_peak(reset=True)
        proc: CandidateProcess | None = None
        held = contextlib.ExitStack()  # GPU memory, released once the candidate is gone
        try:
            fmt = job.format
            if fmt == "auto":
                from sandbox.problem import detect_format

                fmt = detect_format(job.problem)
            job.format = fmt
            with _stage(result, "static"):
                static = static_verdict(job.candidate, fmt)
            if static is not None:
                if self._owns_baselines(job):
                    # The rest of the group waits for this job's baselines.
                    with contextlib.suppress(Exception):
                        self._baselines(job, self._problem(job), result)
                raise Rejected(*static)
            try:
                with _stage(result, "problem"):
                    entry = self._problem(job)
            except ProblemError as err:
                raise Rejected("bad_problem", str(err)) from None
            kernelbench = entry.problem.format == "kernelbench"
            atol = (
                job.atol
                if job.atol is not None
                else (KERNELBENCH_ATOL if kernelbench else DEFAULT_ATOL)
            )
            rtol = (
                job.rtol
                if job.rtol is not None
                else (KERNELBENCH_RTOL if kernelbench else DEFAULT_RTOL)
            )
            self._reserve_gpu(entry, deadline, result, held)
            try:
                # Measured once per problem: a cached answer needs no share of the GPU.
                cached = entry.degenerate is not None
                share = contextlib.nullcontext() if cached else self._shared(result)
                with share, _stage(result, "problem"):
                    reason = self._degenerate(entry, atol, rtol)
            except torch.cuda.OutOfMemoryError:
                raise  # the GPU is full, which is not the problem's fault
            except Exception as err:  # noqa: BLE001 - the problem failed to run
                raise Rejected(
                    "bad_problem", f"the reference failed: {type(err).__name__}: {err}"
                ) from None
            result.problem_degenerate = bool(reason)
            if self._owns_baselines(job):
                self._baselines(job, entry, result)
            with _stage(result, "spawn"):  # takes the spare, starts the next one
                proc = self.take_process()
            self._judge(job, entry, proc, atol, rtol, deadline, result)
            if reason and result.verdict == "correct":
                result.message = f"correct, but the problem is degenerate: {reason}"
        except Rejected as rejection:
            result.verdict = rejection.verdict
            result.message = rejection.message
        except CandidateDied as death:
            result.verdict, result.message = _death_verdict(death, result, job.budget_s)
        except BudgetTimeout as err:
            result.verdict = "sandbox_error"
            result.message = f"the GPU stayed full: {err}"
        except torch.cuda.OutOfMemoryError as err:
            result.verdict = "sandbox_error"
            result.message = (
                "the GPU ran out of memory for this job (workers share the GPU memory: "
                "fewer workers fit larger problems)"
                + "".join(f", {note}" for note in getattr(err, "__notes__", ()))
                + f": {str(err).splitlines()[0][:300]}"
            )
        except Exception as err:  # noqa: BLE001 - our fault: report it, keep the worker
            result.verdict = "sandbox_error"
            result.message = f"grader error: {type(err).__name__}: {str(err)[:500]}"
        finally:
            if proc is not None:
                result.candidate_log = proc.log_tail()[-2000:]
                if self.device == "cuda":
                    self._note_gpu_memory(proc, result)
                with _stage(result, "cleanup"):
                    proc.stop()
            if result.verdict != "correct":
                result.candidate_ms = None
            result.apply_baselines(
                result.eager_ms, result.compile_ms, self.config.speedup_sanity_bound
            )
            result.provenance = self.provenance
            if self.clock is None and job.timing:
                result.timing_unavailable_reason = "no GPU: correctness only (Triton interpreter)"
            if self.device == "cuda":
                with _stage(result, "release"):
                    self._release_gpu_memory()
            self._retire(proc, held)
            result.elapsed_s = time.monotonic() - started
        return result

    @staticmethod
    def _note_gpu_memory(proc: CandidateProcess, result: VerifyResult) -> None:
        """The job's GPU memory peaks: the grader's (its allocator and the buffers it
        shared, at one moment) and, from a candidate still answering, the candidate's
        allocator's. `grader_peak_sum` is the figure earlier runs reported as the grader's
        peak: the allocator's peak plus the buffers' peak, often from different moments."""
        together, allocated = device_share.held_bytes_peak()
        result.gpu_memory_gib["grader_peak"] = together / GIB
        result.gpu_memory_gib["grader_peak_sum"] = (
            allocated + device_share.created_bytes_peak()
        ) / GIB
        if result.verdict == "timeout" or proc.proc.poll() is not None:
            return
        with contextlib.suppress(Exception):  # statistics only: never the verdict
            reply = proc.request(time.monotonic() + MEMORY_QUERY_S, cmd="memory")
            peak = float(reply["peak_bytes"]) if reply.get("ok") else math.nan
            if math.isfinite(peak) and peak >= 0:
                result.gpu_memory_gib["candidate_peak"] = peak / GIB

    def _release_gpu_memory(self) -> None:
        """Hand the job's GPU memory back before its reservation ends.

        What a grader keeps between jobs is outside every reservation and can starve the
        other graders: collect cycles that still hold tensors, then say what remains. A
        cache of at most `KEPT_CACHE_BYTES` stays for the next job.
        """
        if torch.cuda.memory_reserved() <= KEPT_CACHE_BYTES:
            return
        torch.cuda.empty_cache()
        if torch.cuda.memory_reserved() <= RETAINED_GPU_BYTES:
            return
        gc.collect()
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved()
        if reserved > RETAINED_GPU_BYTES:
            print(
                f"drtriton grader {os.getpid()}: {reserved / GIB:.2f} GiB of GPU memory "
                f"still held after a job ({torch.cuda.memory_allocated() / GIB:.2f} GiB "
                "in live tensors)",
                file=sys.stderr,
                flush=True,
            )

    def _retire(self, proc: CandidateProcess | None, held: contextlib.ExitStack) -> None:
        """Reap the stopped candidate, remove its files, then free the job's GPU share.

        In the background: a process with a CUDA context takes a while to die, and the
        verdict need not wait for it. The GPU share is freed only once it is gone.
        """
        if proc is None:
            held.close()
            return

        def reap() -> None:
            try:
                proc.close()
            finally:
                held.close()

        self._reapers = [t for t in self._reapers if t.is_alive()]
        thread = threading.Thread(target=reap, name="drtriton-reaper", daemon=True)
        thread.start()
        self._reapers.append(thread)

    # -- steps --------------------------------------------------------------------
    def _exchange(self, proc: CandidateProcess) -> Exchange:
        return Exchange(proc.job_dir, self.device, self.share_memory)

    def _run(
        self,
        proc: CandidateProcess,
        entry: _ProblemEntry,
        inputs: list[Any],
        expected: list[torch.Tensor],
        mode: str,
        deadline: float,
        atol: float,
        rtol: float,
        result: VerifyResult,
        hold: SharedHold | None = None,
        check_reference: bool = False,
    ) -> tuple[compare.Comparison, dict[str, Any], list[tuple[Any, ...]]]:
        """One call of the candidate in `mode`: its comparison, reply, and its outputs'
        fingerprints (`_fingerprint`; the outputs themselves are let go once judged).

        The grader waits for the device twice: before the command (the reference, with
        `check_reference` its NaN/Inf count, and the copies into the exchange) and for its
        judgment (the inputs as the candidate left them, every output's comparison and
        fingerprint, read back at once). Parts of the call's time go to `run.*` stages.
        """
        exchange = self._exchange(proc)
        with _stage(result, "run.exchange"):
            in_specs = exchange.put("in", inputs, writable=False)
            out_specs = exchange.put("out", expected, writable=True)
            # With files, the harness writes the inputs as the candidate left them into
            # blank ones (until it does they read as zeros: a reply forged without running
            # shows as a mutation). Only the trials look: the checks' runs judge the answer
            # alone, and each look moves the inputs across the bus twice more (GiBs, for
            # paper-sized problems). Shared memory needs no copy: the candidate ran on it.
            after_specs = exchange.blanks(in_specs, "after") if mode == "normal" else []
            left_specs = (after_specs or in_specs) if mode == "normal" else []
            if check_reference:
                self._check_reference(expected, inputs)  # its read waits for the copies too
            fds = exchange.descriptors()
        with _stage(result, "run.round_trip"):
            reply = proc.request(
                deadline,
                lease=(SHARED_LEASE_S, hold.overrun) if hold is not None and hold.held else None,
                fds=fds,
                cmd="run",
                inputs=in_specs,
                outputs=out_specs,
                inputs_after=after_specs,
                mode=mode,
            )
        _add_reported_stage(result, "run.harness", reply.get("harness_s"))
        _add_reported_stage(result, "run.call", reply.get("call_s"))
        _add_reported_stage(result, "run.inputs", reply.get("inputs_s"))
        _add_reported_stage(result, "run.outputs", reply.get("outputs_s"))
        if mode != "normal":  # the checks' calls apart from the trials'
            _add_reported_stage(result, f"run.{mode}.harness", reply.get("harness_s"))
        self._raise_failure(reply)
        with _stage(result, "run.judge"):
            # One input on the device at a time (a file is copied), compared there.
            changed = [
                (i, compare.differs(value.detach(), exchange.read(spec)))
                for i, (value, spec) in enumerate(zip(inputs, left_specs, strict=False))
                if isinstance(value, torch.Tensor) and value.numel()
            ]
            try:
                wrong = self._wrong_reply(reply, out_specs, len(expected))
            except Exception as err:  # noqa: BLE001 - a malformed reply, raised in turn below
                wrong = err
            outputs = [] if wrong is not None else [exchange.read(spec) for spec in out_specs]
            exchange.release(out_specs)  # the outputs' views hold their buffers
            fingerprints = [_fingerprint(t) for t in outputs] if mode == "normal" else []
            judged = wrong is None
            comparisons, flags = _compare_all(
                expected if judged else [],
                outputs,
                atol,
                rtol,
                entry.noise if judged else None,
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
                comparisons = self._allow_for_rounding(
                    entry, inputs, expected, outputs, comparisons, atol, rtol, result
                )
        return compare.combine(comparisons), reply, fingerprints

    @staticmethod
    def _wrong_reply(
        reply: dict[str, Any], out_specs: list[dict[str, Any]], count: int
    ) -> Rejected | None:
        """What is wrong with the outputs the reply describes (None: they can be compared)."""
        if reply.get("count") != count:
            return Rejected(
                "wrong_output", f"returned {reply.get('count')} outputs, expected {count}"
            )
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

    def _compare(
        self,
        entry: _ProblemEntry,
        inputs: list[Any],
        expected: list[torch.Tensor],
        outputs: list[torch.Tensor],
        atol: float,
        rtol: float,
        result: VerifyResult,
    ) -> list[compare.Comparison]:
        """Each output against the reference, allowing for the reference's own rounding."""
        comparisons, _ = _compare_all(expected, outputs, atol, rtol, entry.noise)
        return self._allow_for_rounding(
            entry, inputs, expected, outputs, comparisons, atol, rtol, result
        )

    def _allow_for_rounding(
        self,
        entry: _ProblemEntry,
        inputs: list[Any],
        expected: list[torch.Tensor],
        outputs: list[torch.Tensor],
        comparisons: list[compare.Comparison],
        atol: float,
        rtol: float,
        result: VerifyResult,
    ) -> list[compare.Comparison]:
        """The comparisons again with the reference's rounding allowed for, the first time
        an output misses the tolerance by value alone.

        The allowance is measured once per problem, on that call's inputs (which `inputs`
        still holds as the grader drew them). While the float64 reference runs, the
        reference and the outputs wait in host memory when they are large (`_parked`) and
        the inputs are widened in place: on the GPU the grader holds the float64 run alone.
        """
        if entry.noise is not None or not any(c.out_of_tolerance for c in comparisons):
            return comparisons
        # A few misses may be near-ties: worth a second float64 run on nudged inputs.
        ties = [
            c.out_of_tolerance and c.mismatch_fraction <= compare.TIE_FACTOR * compare.TIE_CAP
            for c in comparisons
        ]
        with _stage(result, "rounding.float64"), _parked(expected, outputs):
            noise = self._rounding_noise(entry.problem, inputs, expected, atol, rtol, ties)
        if noise is None:
            return comparisons
        entry.noise = noise
        return _compare_all(expected, outputs, atol, rtol, noise)[0]

    @staticmethod
    def _rounding_noise(
        problem: Problem,
        inputs: list[Any],
        expected: list[torch.Tensor],
        atol: float,
        rtol: float,
        ties: Sequence[bool] = (),
    ) -> list[compare.Allowance] | None:
        """Per output, what the float32 reference's own error allows (None: not now).

        `inputs` are widened to float64 in place while the float64 reference runs, and
        narrowed back after (exactly): their float32 copies are not held beside it. Where
        `ties` says an output may hold near-ties, the float64 reference runs again on
        nudged inputs (`compare.allowance`).
        """
        with _widened_in_place(inputs):
            exact: list[Any] | None = None
            try:
                full = False
                try:
                    exact = problem.reference_float64(inputs)
                except torch.cuda.OutOfMemoryError:
                    full = True  # handled outside: the error's frames hold GPU memory
                device = "cpu" if full else None
                if full:
                    # No room on the GPU for float64 copies of GiB tensors: the host has
                    # more (a whole-tensor layer_norm was judged wrong for want of this
                    # allowance).
                    torch.cuda.empty_cache()
                    exact = problem.reference_float64(inputs, device=device)
            except MemoryError:
                return None  # not now; another call may have room
            except Exception:  # noqa: BLE001 - no float64 version of this problem: no allowance
                return [compare.Allowance()] * len(expected)
            if exact is None or len(exact) != len(expected):
                return [compare.Allowance()] * len(expected)
            tied = list(ties) or [False] * len(exact)
            moved = _nudged_reference(problem, inputs, device) if any(tied) else None
            if moved is None or len(moved) != len(exact):
                moved = [None] * len(exact)
            noise = [
                compare.allowance(a, b, atol, rtol, m if tie else None)
                for a, b, m, tie in zip(expected, exact, moved, tied, strict=True)
            ]
            del exact, moved  # before the inputs are narrowed back
        return noise

    def _judge(
        self,
        job: Job,
        entry: _ProblemEntry,
        proc: CandidateProcess,
        atol: float,
        rtol: float,
        deadline: float,
        result: VerifyResult,
    ) -> None:
        problem = entry.problem
        start_deadline = max(deadline, time.monotonic() + PROCESS_START_BUDGET_S)
        with _stage(result, "start"):
            proc.wait_ready(start_deadline)
        for name, seconds in proc.startup_seconds(taken=time.monotonic()).items():
            _add_stage(result, f"process.{name}", seconds)
        source_path = os.path.join(proc.job_dir, "candidate.py")
        with open(source_path, "w") as handle:
            handle.write(job.candidate)
        hand_over(source_path)
        with _stage(result, "load"):
            reply = proc.request(
                deadline,
                cmd="load",
                path=source_path,
                format=problem.format,
                init_inputs=problem.init_inputs,
                init_seed=42,
                gpu_memory_bytes=self._candidate_gpu_bytes(entry),
            )
        self._raise_if_gpu_full(reply)
        if not reply.get("ok"):
            raise Rejected(
                reply.get("error_type", "compile_error"), str(reply.get("message", ""))[:4000]
            )

        base_seed = job.seed if job.seed is not None else secrets.randbits(48)
        # Triton compiles on the first launch: seconds of CPU, spent here while the job
        # holds no share of the GPU, so that timed loops elsewhere need not wait.
        with _stage(result, "compile"):
            self._compile(proc, entry, deadline)
        previous: list[tuple[Any, ...]] | None = None  # the last trial's output fingerprints
        launches = 0
        slowest_call = 0.0  # seconds, of the trials after the first (which may autotune)
        for index in range(job.trials):
            with self._shared(result) as hold:
                # On a GPU the reference is only queued here; `_run` checks it (NaN/Inf)
                # with the same wait for the device that sends the inputs on.
                with _stage(result, "reference"):
                    with _stage(result, "reference.draw"):
                        inputs = problem.make_inputs(base_seed + index)
                    expected = problem.reference(inputs)
                called = time.monotonic()
                with _stage(result, "first_trial" if index == 0 else "trials"):
                    comparison, reply, fingerprints = self._run(
                        proc,
                        entry,
                        inputs,
                        expected,
                        "normal",
                        deadline,
                        atol,
                        rtol,
                        result,
                        hold,
                        check_reference=True,
                    )
                if index > 0 or job.trials == 1:
                    slowest_call = max(slowest_call, time.monotonic() - called)
                self._check_trial(index, comparison, reply, fingerprints, previous, result)
                previous = fingerprints
                # Freed before the next trial draws its inputs: GiB tensors on a shared GPU.
                del inputs, expected
            launches = max(launches, int(reply.get("launches", 0)))
        result.kernel_launches = launches

        # Fallback: PyTorch compute poisoned with NaN; the answer must not change.
        comparison = self._fresh_run(
            proc, entry, base_seed + 1000, "poison", deadline, atol, rtol, result
        )
        if not comparison.passed:
            raise Rejected(
                "torch_fallback",
                f"with PyTorch compute ops disabled the output is wrong ({comparison.message}): "
                "the answer is computed by PyTorch, not Triton",
            )
        # Converse: Triton launches turned off; the answer must change.
        comparison = self._fresh_run(
            proc, entry, base_seed + 2000, "noop", deadline, atol, rtol, result
        )
        if comparison.passed:
            raise Rejected(
                "torch_fallback",
                "with every Triton launch turned off the output is still correct: "
                "the answer does not come from the Triton kernels",
            )
        self._check_log_cap(proc)
        if job.timing and self.clock is not None:
            self._time(entry, proc, deadline, atol, rtol, base_seed, slowest_call, result)
        result.message = f"correct on {job.trials} trials"

    def _fresh_run(
        self,
        proc: CandidateProcess,
        entry: _ProblemEntry,
        seed: int,
        mode: str,
        deadline: float,
        atol: float,
        rtol: float,
        result: VerifyResult,
    ) -> compare.Comparison:
        """One call in `mode` on fresh inputs, with a share of the GPU; its comparison."""
        problem = entry.problem
        with self._shared(result) as hold:
            with _stage(result, "reference"):
                with _stage(result, "reference.draw"):
                    inputs = problem.make_inputs(seed)
                expected = problem.reference(inputs)
            with _stage(result, f"{mode}_check"):
                comparison, _, _ = self._run(
                    proc, entry, inputs, expected, mode, deadline, atol, rtol, result, hold
                )
        return comparison

    def _check_trial(
        self,
        index: int,
        comparison: compare.Comparison,
        reply: dict[str, Any],
        fingerprints: list[tuple[Any, ...]],
        previous: list[tuple[Any, ...]] | None,
        result: VerifyResult,
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
            if previous is not None and _same_fingerprints(previous, fingerprints):
                hint = " (the same output as for the previous, different inputs: cached?)"
            raise Rejected("wrong_output", f"trial {index}: {comparison.message}{hint}")
        if reply.get("launches", 0) == 0:
            raise Rejected("no_triton_kernel", "no Triton kernel was launched")

    def _compile(self, proc: CandidateProcess, entry: _ProblemEntry, deadline: float) -> None:
        """Run the candidate once with launches that compile and load but run nothing.

        Its inputs are uninitialised device memory of the right shapes (nothing reads
        them), so this call puts no work on the GPU. Under the CPU interpreter there is
        nothing to compile and the call runs the host code alone: the same steps on
        both. A kernel that fails to compile is reported by the first trial (the
        compile launch keeps quiet); anything else the candidate does wrong on this
        call is judged like a trial's.
        """
        if entry.input_layout is None:
            entry.input_layout = entry.problem.input_layout()
        reply = proc.request(
            deadline,
            cmd="run",
            inputs=entry.input_layout,
            outputs=[],
            inputs_after=[],
            mode="compile",
        )
        self._raise_failure(reply)

    @staticmethod
    def _raise_if_gpu_full(reply: dict[str, Any]) -> None:
        """A candidate that ran out of GPU memory under its cap met a GPU that others
        filled: no fault of the kernel (a `sandbox_error`, which clients may retry)."""
        if reply.get("error_type") == "gpu_full":
            message = str(reply.get("message", "")).strip().splitlines() or [""]
            raise torch.cuda.OutOfMemoryError(
                f"the candidate's allocation fitted its cap but not the GPU: {message[0][:300]}"
            )

    @staticmethod
    def _raise_failure(reply: dict[str, Any]) -> None:
        """Reject the candidate when its harness reports that a call failed."""
        if reply.get("ok"):
            return
        Grader._raise_if_gpu_full(reply)
        verdict = reply.get("error_type", "runtime_error")
        if verdict not in (
            "runtime_error",
            "compile_error",
            "resource_limit",
            "torch_fallback",
            "tampering",
            "wrong_output",
        ):
            verdict = "runtime_error"
        raise Rejected(verdict, str(reply.get("message", ""))[:4000])

    def _check_log_cap(self, proc: CandidateProcess) -> None:
        """Output past the cap is a broken candidate, even if it swallowed the write errors."""
        with contextlib.suppress(OSError):
            if os.path.getsize(proc.log_path) >= self.limits.file_mb * 2**20:
                raise Rejected(
                    "resource_limit", f"wrote more than {self.limits.file_mb} MiB to stdout/stderr"
                )

    @staticmethod
    def _check_reference(expected: list[torch.Tensor], inputs: Sequence[Any] = ()) -> None:
        """Reject a problem whose answer is more than a few stray NaN or Inf values.

        A handful are a property of the draw, not of the problem: a GPU's normal sampler
        returns an exact 0.0 about once in 2^24 draws, so every GiB-sized `div` has a few
        Infs, and a whole broadcast row of them where the 0.0 is in a small input. The
        candidate must then match them exactly (`compare.compare_tensor`). Counted chunk
        by chunk, and read back at once."""
        checked = [(i, out) for i, out in enumerate(expected) if out.is_floating_point()]
        _, counts = compare.conclude([], *(compare.nonfinite(out) for _, out in checked))
        smallest = min(
            (x.numel() for x in inputs if isinstance(x, torch.Tensor) and x.numel()), default=0
        )
        for (i, out), count in zip(checked, counts, strict=True):
            nonfinite = int(count)
            spread = out.numel() // smallest if smallest else 0  # outputs one input value makes
            limit = max(NONFINITE_LIMIT * out.numel(), STRAY_DRAWS * spread)
            if nonfinite > min(limit, max(NONFINITE_LIMIT, NONFINITE_CAP) * out.numel()):
                raise Rejected(
                    "bad_problem",
                    f"reference output {i} contains NaN or Inf ({nonfinite} of "
                    f"{out.numel()} values)",
                )

    # -- timing -------------------------------------------------------------------
    def _owns_baselines(self, job: Job) -> bool:
        """Whether this job measures the problem's baselines (the runner defers the rest)."""
        return job.timing and self.clock is not None and not job.defer_baselines

    def _baselines(self, job: Job, entry: _ProblemEntry, result: VerifyResult) -> None:
        """Eager and torch.compile times for this problem: known, cached, or measured now."""
        for name, value in job.known_baselines.items():
            entry.baseline_ms.setdefault(name, value)
        wanted = [n for n in job.baselines if n not in entry.baseline_ms]
        if wanted:
            self._measure_baselines(entry, wanted, result)
        result.eager_ms = entry.baseline_ms.get("eager") if "eager" in job.baselines else None
        result.compile_ms = (
            entry.baseline_ms.get("torch_compile") if "torch_compile" in job.baselines else None
        )

    def _measure_baselines(
        self, entry: _ProblemEntry, names: list[str], result: VerifyResult
    ) -> None:
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
            with _stage(result, "baseline_compile"), torch.no_grad():
                try:
                    compiled = torch.compile(problem.reference_fn)
                    self._warm_up_compiled(compiled, problem, seed + 5000, result)
                    functions["torch_compile"] = compiled
                except Exception:  # noqa: BLE001 - reported as a missing baseline
                    functions["torch_compile"] = None
        runs, warmup = self.config.timing_runs, self.config.timing_warmup
        with self._exclusive(result), torch.no_grad():
            inputs = problem.make_inputs(seed + 3000)
            for name in names:
                fn = functions.get(name)
                value: float | None = None
                if fn is not None:
                    try:
                        call = functools.partial(fn, *inputs)
                        n, n_warm = _loop_sizes(time_wall(call, self.clock, 1), runs, warmup)
                        event_ms = summarize(time_cuda(call, self.clock, n, n_warm))[0]
                        host_runs = _baseline_host_runs(event_ms, n)
                        # A loop past HOST_LOOP_MS is no longer one a delay distorts much, and
                        # repeating a 2.4 s call's check would cost seconds of exclusive GPU.
                        short = event_ms * host_runs <= HOST_LOOP_MS
                        loops = (
                            time_wall(call, self.clock, host_runs)
                            for _ in range(HOST_LOOP_REPEATS if short else 1)
                        )
                        host = quickest_loop(event_ms, loops, BASELINE_HOST_SLACK)
                        value = event_ms if host <= event_ms * (1 + BASELINE_HOST_SLACK) else host
                    except Exception:  # noqa: BLE001 - a baseline that cannot run is missing
                        value = None
                entry.baseline_ms[name] = value

    def _warm_up_compiled(
        self, compiled: Any, problem: Problem, seed: int, result: VerifyResult
    ) -> None:
        """The first call of a compiled baseline: compile unheld, GPU work under the gate."""
        from sandbox.inductor_gate import gated_autotuning

        with gated_autotuning(lambda: self._shared(result)) as gated:
            with self._shared(result):
                inputs = problem.make_inputs(seed)
            with contextlib.nullcontext() if gated else self._shared(result):
                compiled(*inputs)
            torch.cuda.synchronize()  # its kernels end before this grader times anything

    def _time(
        self,
        entry: _ProblemEntry,
        proc: CandidateProcess,
        deadline: float,
        atol: float,
        rtol: float,
        base_seed: int,
        slowest_call_s: float,
        result: VerifyResult,
    ) -> None:
        """Time the candidate: CUDA events per run, cross-checked by this process's clock.

        The candidate cannot patch this process's clock: a rigged event timer shows up
        as host time above the reported median, and then the host time counts. The
        outputs of both timed loops are checked afterwards. Each loop has the GPU to
        itself, for a lease its trials' pace bounds (TIMING_LEASE_S).
        """
        from sandbox.timing import reported_ms, summarize

        problem = entry.problem
        with self._shared(result), _stage(result, "timing_io"):
            inputs = problem.make_inputs(base_seed + 3000)
            expected = problem.reference(inputs)
            self._stage_inputs(proc, inputs, deadline)
        runs, warmup = _loop_sizes(
            slowest_call_s * 1e3, self.config.timing_runs, self.config.timing_warmup
        )
        lease_s = TIMING_LEASE_S + TIMING_LEASE_FACTOR * (runs + warmup + 1) * slowest_call_s
        walls: list[dict[str, Any]] = []
        median = spread = host_ms = 0.0
        with self._exclusive(result), _raised_priority(proc):
            try:
                with _stage(result, "timing.events"):
                    events = proc.request(
                        min(deadline, time.monotonic() + lease_s),
                        cmd="time",
                        slot="events",
                        runs=runs,
                        warmup=warmup,
                    )
                times = _event_times(events, runs)
                if times:
                    median, spread = summarize(times)
                    with _stage(result, "timing.host"):
                        host_ms, walls = self._host_time(proc, median, runs, lease_s, deadline)
            except CandidateDied as death:
                if death.verdict == "timeout" and time.monotonic() < deadline:
                    raise CandidateDied(
                        "timeout",
                        f"a timed loop ran past {lease_s:.1f} s, far longer than its "
                        f"correctness trials ({slowest_call_s:.3f} s per call) predict",
                    ) from None
                raise
        for reply in (events, *walls):
            self._raise_if_gpu_full(reply)
            if not reply.get("ok"):
                raise Rejected(
                    reply.get("error_type", "runtime_error"), str(reply.get("message", ""))[:4000]
                )
        for reply in (events, *walls):
            with contextlib.suppress(TypeError, ValueError):
                # As the candidate reports it: tells scheduling delays from the loop itself.
                _add_stage(result, "timed_loops", max(0.0, float(reply.get("loop_s", 0.0))))
        if not times:
            raise Rejected("tampering", "the timing loop returned impossible measurements")
        with self._shared(result), _stage(result, "timing_io"):
            for slot in ("events", "wall"):  # one at a time: one set of outputs held
                exchange = self._exchange(proc)
                specs = exchange.put(
                    f"timed_{slot}_{secrets.token_hex(8)}_", expected, writable=True
                )
                fetched = proc.request(
                    deadline, fds=exchange.descriptors(), cmd="fetch", outputs={slot: specs}
                )
                if not fetched.get("ok"):
                    raise Rejected("runtime_error", str(fetched.get("message", ""))[:4000])
                outputs = [exchange.read(s) for s in specs]
                exchange.release(specs)  # the views hold their buffers until judged
                self._check_timed(entry, inputs, expected, outputs, atol, rtol, result)
                del outputs
        result.candidate_ms, result.retimed = reported_ms(median, host_ms)
        result.candidate_spread = spread
        result.timing_runs = runs

    @staticmethod
    def _host_time(
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

    @contextlib.contextmanager
    def _shared(self, result: VerifyResult) -> Iterator[SharedHold | None]:
        """A share of the GPU for correctness work (`sandbox.gpu_gate`); None without one."""
        if self.gate is None:
            yield None
            return
        with self.gate.shared() as hold:
            _add_stage(result, "gpu_wait", hold.waited_s)
            yield hold

    @contextlib.contextmanager
    def _exclusive(self, result: VerifyResult) -> Iterator[None]:
        """The GPU alone, host-wide, for a timed loop: concurrent work distorts timings."""
        if self.gate is None:
            raise RuntimeError("timing needs a GPU")
        with self.gate.exclusive(quiet_within=OVERRUN_WAIT_S) as hold:
            _add_stage(result, "timing_wait", hold.waited_s)
            _add_stage(result, "timing_overrun_wait", hold.overrun_wait_s)
            if not hold.quiet:
                print(
                    f"sandbox: timing beside a call still running past its GPU lease "
                    f"after {hold.overrun_wait_s:.1f} s",
                    file=sys.stderr,
                )
            with _stage(result, "timing"):
                yield

    def _stage_inputs(self, proc: CandidateProcess, inputs: list[Any], deadline: float) -> None:
        """Hand the candidate the inputs of the timed runs, outside the timing lock."""
        exchange = self._exchange(proc)
        in_specs = exchange.put("in", inputs, writable=False)
        staged = proc.request(deadline, fds=exchange.descriptors(), cmd="stage", inputs=in_specs)
        self._raise_if_gpu_full(staged)
        if not staged.get("ok"):
            raise Rejected("runtime_error", str(staged.get("message", ""))[:4000])

    def _check_timed(
        self,
        entry: _ProblemEntry,
        inputs: list[Any],
        expected: list[torch.Tensor],
        outputs: list[torch.Tensor],
        atol: float,
        rtol: float,
        result: VerifyResult,
    ) -> None:
        """A timed loop's outputs, judged as a trial's (its rounding allowance measured too).

        The timed inputs are new draws: a long reduction whose trials happened to pass
        without the allowance may need it here (a conv_transpose3d over 17k terms did).
        """
        comparisons = self._compare(entry, inputs, expected, outputs, atol, rtol, result)
        check = compare.combine(comparisons)
        if not check.passed:
            raise Rejected("wrong_output", f"wrong while being timed: {check.message}")
