"""The grader: judges one job at a time, in a process that runs no candidate code.

For each job it loads the (trusted) problem, draws fresh inputs from secret seeds,
computes the references, and drives a fresh jailed candidate process through the
checks of DESIGN §4, after the static gate (`sandbox.gate`) has passed its source: load,
correctness trials (outputs, dtype, shape, NaN, aliasing, mutation, caching) with
PyTorch compute refused on every call and, at a secret place among them, one call with
Triton launches turned off, then timing against eager PyTorch and torch.compile on a
GPU. All comparisons happen here.

This module is the orchestration and the grader's long-lived state (its candidate
processes, problem cache, GPU handles); the steps live in `sandbox.grading`:
`job` (the job's context), `trials` (the checks, call by call), `judgment` (outputs
against the reference), `timed` (timed loops and baselines), `gpu` (the GPU shared with
other graders), `stages` (the stage clock).
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Any

import torch

from sandbox import compare, device_share
from sandbox.config import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    KERNELBENCH_ATOL,
    KERNELBENCH_RTOL,
    SandboxConfig,
)
from sandbox.gpu_budget import GIB, BudgetTimeout, GpuMemoryBudget
from sandbox.gpu_gate import GpuGate
from sandbox.grading import gpu, timed, trials
from sandbox.grading.idle import IdleProbe
from sandbox.grading.job import (
    Job,
    JobContext,
    ProblemEntry,
    Rejected,
    death_verdict,
    without_frames,
)
from sandbox.grading.stages import add_stage, stage
from sandbox.isolation import JOB_TMP_DIR, Limits
from sandbox.launchers import LauncherCache
from sandbox.problem import ProblemError, load_problem, source_key
from sandbox.process import CandidateDied, CandidateProcess, candidate_env
from sandbox.replies import MalformedReply
from sandbox.result import VerifyResult
from sandbox.static_checks import static_verdict
from sandbox.transfer import ExchangeTampered
from sandbox.zygote import Zygote, ZygoteError

__all__ = ["Grader", "Job", "Rejected", "provenance"]

SANDBOX_VERSION = "0.1.0"
PROCESS_START_BUDGET_S = 120.0
MAX_CACHED_PROBLEMS = 64


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


def tolerances(job: Job, entry: ProblemEntry) -> tuple[float, float]:
    """The job's atol and rtol: as asked, else the defaults of the problem's format."""
    kernelbench = entry.problem.format == "kernelbench"
    atol = KERNELBENCH_ATOL if kernelbench else DEFAULT_ATOL
    rtol = KERNELBENCH_RTOL if kernelbench else DEFAULT_RTOL
    return (
        job.atol if job.atol is not None else atol,
        job.rtol if job.rtol is not None else rtol,
    )


def failure_verdict(error: Exception, result: VerifyResult, budget_s: float) -> tuple[str, str]:
    """The verdict and message of a job that ended in `error`.

    The candidate's doing (a failed check, a death, a malformed reply, its files tampered
    with) is a verdict on it; the host's (the GPU full, the grader's own error) is a
    `sandbox_error`, which clients retry.
    """
    if isinstance(error, Rejected):
        return error.verdict, error.message
    if isinstance(error, CandidateDied):
        return death_verdict(error, result, budget_s)
    if isinstance(error, MalformedReply):  # only the candidate's process writes replies
        return error.verdict, error.message
    if isinstance(error, ExchangeTampered):
        return "tampering", f"the candidate's process {error}"
    if isinstance(error, BudgetTimeout):
        return "sandbox_error", f"the GPU stayed full: {error}"
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return "sandbox_error", (
            "the GPU ran out of memory for this job (workers share the GPU memory: "
            "fewer workers fit larger problems)"
            + "".join(f", {note}" for note in getattr(error, "__notes__", ()))
            + f": {str(error).splitlines()[0][:300]}"
        )
    return "sandbox_error", f"grader error: {type(error).__name__}: {str(error)[:500]}"


class Grader:
    """Judges jobs one at a time (`grade`); keeps candidate processes started ahead."""

    def __init__(self, config: SandboxConfig, device: str) -> None:
        self.config = config
        self.device = device
        self.limits = Limits(
            cpu_s=config.candidate_cpu_s,
            file_mb=config.candidate_output_mb,
            job_dir_mb=config.candidate_job_dir_mb,
            memory_mb=config.candidate_memory_mb,
            use_address_space_limit=device == "cpu",
        )
        os.makedirs(config.job_root, exist_ok=True)
        self.workdir = os.path.join(config.job_root, f"grader-{os.getpid()}")
        os.makedirs(self.workdir, exist_ok=True)
        self.problems: OrderedDict[str, ProblemEntry] = OrderedDict()
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
        self.idle_probe: IdleProbe | None = None
        # Tensors cross to candidates in shared device memory where the driver allows.
        self.share_memory = False
        if device == "cuda":
            self.launchers = LauncherCache(os.path.join(config.job_root, "launchers"))
            from sandbox.timing import bind_clock

            self.gate = GpuGate(config.job_root)
            with self.gate.exclusive():  # the spin rate, measured with the GPU to itself
                self.clock = bind_clock()
                # What a known kernel takes on an idle GPU: the baselines' idle check.
                self.idle_probe = IdleProbe(self.clock)
                self.idle_probe.calibrate()
            why_not = device_share.available()  # after PyTorch has made its CUDA context
            self.share_memory = why_not is None
            if why_not is not None:
                print(
                    f"drtriton sandbox: tensors go through files (no shared GPU memory: {why_not})",
                    file=sys.stderr,
                )
            self.gpu_budget = GpuMemoryBudget(
                os.path.join(config.job_root, "gpu-memory.budget"),
                gpu.gpu_budget_gib(config.workers),
            )
            device_share.track_with_allocator()  # the job's peaks (`gpu.note_gpu_memory`)

    # -- candidate processes ------------------------------------------------------
    def _zygote_alive(self) -> Zygote:
        """This grader's fork server, started again if it died."""
        if self.zygote is None or not self.zygote.alive:
            if self.zygote is not None:
                self.zygote.close()
            home = os.path.join(self.workdir, "zygote")
            os.makedirs(os.path.join(home, JOB_TMP_DIR), exist_ok=True)
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
        self._wait_for_reapers()
        while self.spares:
            self.spares.popleft().close()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def _reserve_gpu(
        self,
        job: Job,
        entry: ProblemEntry,
        deadline: float,
        result: VerifyResult,
        held: contextlib.ExitStack,
        alone: bool = False,
    ) -> None:
        """Hold this job's share of the GPU's memory until `held` closes (`sandbox.gpu_budget`);
        `alone`: all of it."""
        if self.gpu_budget is None:
            return
        known = {**job.known_baselines, **entry.baseline_ms}
        compiles = self._owns_baselines(job) and "torch_compile" in job.baselines
        compiles = compiles and "torch_compile" not in known
        timing = (0, 0)
        if job.timing and self.clock is not None:
            timing = entry.timing_bytes(self.config.timing_runs, self.config.timing_warmup)
        gib = gpu.job_gpu_gib(entry.io(), compiles_baseline=compiles, timing_bytes=timing)
        if alone:
            gib = self.gpu_budget.capacity_gib
        result.gpu_memory_gib.update(io=entry.io() / GIB, reserved=float(gib))
        with stage(result, "gpu_memory_wait"):
            held.enter_context(self.gpu_budget.reserve(gib, deadline))

    # -- problems -----------------------------------------------------------------
    def _problem(self, job: Job) -> ProblemEntry:
        key = source_key(job.problem + job.format)
        entry = self.problems.get(key)
        if entry is None:
            entry = ProblemEntry(load_problem(job.problem, job.format, self.device, self.workdir))
            self.problems[key] = entry
            while len(self.problems) > MAX_CACHED_PROBLEMS:
                self.problems.popitem(last=False)
        self.problems.move_to_end(key)
        return entry

    def _degenerate(self, entry: ProblemEntry, atol: float, rtol: float) -> str:
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
        """Judge one job: its verdict, whatever the candidate (or this grader) did.

        A job that met a full GPU (`gpu.should_retry_alone`) runs once more, with the whole
        memory budget, within its deadline: one that fits the GPU alone waits, not fails.
        """
        started = time.monotonic()
        result, error = self._attempt(job, started, alone=False)
        if gpu.should_retry_alone(error, self.gpu_budget is not None):
            self._wait_for_reapers()  # the first try's share is free before all is asked
            first = result
            result, _ = self._attempt(job, started, alone=True)
            add_stage(result, "gpu_retry", first.elapsed_s)
            result.message += (
                f" (after running out of GPU memory beside other jobs: {first.message})"
            )
        result.elapsed_s = time.monotonic() - started
        return result

    def _attempt(
        self, job: Job, started: float, alone: bool
    ) -> tuple[VerifyResult, Exception | None]:
        """One try at the job (`alone`: with the whole GPU memory budget); its result and
        the error it ended in, if any."""
        result = VerifyResult(verdict="correct", request_id=job.request_id)
        error: Exception | None = None
        if self.device == "cuda":  # this job's peaks, for `gpu_memory_gib`
            device_share.held_bytes_peak(reset=True)
            device_share.created_bytes_peak(reset=True)
        taken: list[CandidateProcess] = []  # the job's candidate process, once taken
        held = contextlib.ExitStack()  # GPU memory, released once the candidate is gone
        try:
            self._grade(job, result, started + job.budget_s, held, taken, alone)
        except Exception as err:  # noqa: BLE001 - every failure is answered, the worker kept
            error = without_frames(err)  # (the job's tensors go before its memory is released)
            result.verdict, result.message = failure_verdict(err, result, job.budget_s)
        finally:
            self._finish(job, result, taken[0] if taken else None, held)
            result.elapsed_s = time.monotonic() - started
        return result, error

    def _grade(
        self,
        job: Job,
        result: VerifyResult,
        deadline: float,
        held: contextlib.ExitStack,
        taken: list[CandidateProcess],
        alone: bool = False,
    ) -> None:
        """The job's steps, up to its verdict; failures are raised (`failure_verdict`)."""
        if job.format == "auto":
            from sandbox.problem import detect_format

            try:
                job.format = detect_format(job.problem)
            except ProblemError as err:
                raise Rejected("bad_problem", str(err)) from None
        with stage(result, "static"):
            static = static_verdict(job.candidate, job.format, gate=self.config.static_gate)
        if static is None and time.monotonic() > deadline:
            # The gate's cost grows with the source: a huge one must not buy time.
            raise Rejected("timeout", "the job's time budget ran out in the static checks")
        if static is not None:
            if self._owns_baselines(job):
                # The rest of the group waits for this job's baselines, measured in a
                # reservation of GPU memory like any job's.
                with contextlib.suppress(Exception):
                    entry = self._problem(job)
                    self._reserve_gpu(job, entry, deadline, result, held, alone)
                    self._baselines(job, entry, result)
            raise Rejected(*static)
        try:
            with stage(result, "problem"):
                entry = self._problem(job)
        except ProblemError as err:
            raise Rejected("bad_problem", str(err)) from None
        atol, rtol = tolerances(job, entry)
        self._reserve_gpu(job, entry, deadline, result, held, alone)
        try:
            # Measured once per problem: a cached answer needs no share of the GPU.
            cached = entry.degenerate is not None
            share = contextlib.nullcontext() if cached else gpu.shared_hold(self.gate, result)
            with share, stage(result, "problem"):
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
        with stage(result, "spawn"):  # takes the spare, starts the next one
            taken.append(self.take_process())
        context = JobContext(
            job=job,
            entry=entry,
            atol=atol,
            rtol=rtol,
            deadline=deadline,
            base_seed=job.seed if job.seed is not None else secrets.randbits(48),
            result=result,
            config=self.config,
            device=self.device,
            gate=self.gate,
            clock=self.clock,
            share_memory=self.share_memory,
        )
        self._judge(context, taken[0])
        if reason and result.verdict == "correct":
            result.message = f"correct, but the problem is degenerate: {reason}"

    def _finish(
        self,
        job: Job,
        result: VerifyResult,
        proc: CandidateProcess | None,
        held: contextlib.ExitStack,
    ) -> None:
        """The result completed (log, memory, baselines, provenance), the candidate stopped
        and left to the reaper."""
        if proc is not None:
            result.candidate_log = proc.log_tail()[-2000:]
            if self.device == "cuda":
                gpu.note_gpu_memory(proc, result)
            with stage(result, "cleanup"):
                proc.stop()
        if result.verdict != "correct":
            result.candidate_ms = None
        result.apply_baselines(result.eager_ms, result.compile_ms, self.config.speedup_sanity_bound)
        result.provenance = self.provenance
        if self.clock is None and job.timing:
            result.timing_unavailable_reason = "no GPU: correctness only (Triton interpreter)"
        if self.device == "cuda":
            with stage(result, "release"):
                gpu.release_gpu_memory()
        self._retire(proc, held)

    def _wait_for_reapers(self) -> None:
        """Until ended candidates are gone, and their GPU shares with them."""
        for thread in self._reapers:
            thread.join(timeout=30)
        self._reapers = []

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

    def _judge(self, ctx: JobContext, proc: CandidateProcess) -> None:
        """The candidate's checks, in order (`sandbox.grading.trials`), then its timing.

        A candidate's claim that the GPU was full is confirmed here or rejected
        (`gpu.gpu_full_verdict`).
        """
        try:
            self._checks(ctx, proc)
        except gpu.CandidateOutOfMemory as claim:
            cap = ctx.candidate_gpu_bytes()
            verdict, message = gpu.gpu_full_verdict(claim.reported, cap, gpu.free_gpu_bytes())
            if verdict == "sandbox_error":
                raise torch.cuda.OutOfMemoryError(message) from None
            raise Rejected(verdict, message) from None

    def _checks(self, ctx: JobContext, proc: CandidateProcess) -> None:
        """`_judge`'s steps."""
        start_deadline = max(ctx.deadline, time.monotonic() + PROCESS_START_BUDGET_S)
        with ctx.stage("start"):
            proc.wait_ready(start_deadline)
        for name, seconds in proc.startup_seconds(taken=time.monotonic()).items():
            add_stage(ctx.result, f"process.{name}", seconds)
        trials.load(ctx, proc)
        # Triton compiles on the first launch: seconds of CPU, spent here while the job
        # holds no share of the GPU, so that timed loops elsewhere need not wait.
        with ctx.stage("compile"):
            trials.compile_pass(ctx, proc)
        slowest_call = trials.run_trials(ctx, proc)  # the no-launch call among them
        trials.check_log_cap(proc, self.limits.file_mb)
        note = ""
        if ctx.job.timing and self.clock is not None:
            note = timed.time_candidate(ctx, proc, slowest_call)
        ctx.result.message = f"correct on {ctx.job.trials} trials" + (
            f" (timed with {note})" if note else ""
        )

    def _owns_baselines(self, job: Job) -> bool:
        """Whether this job measures the problem's baselines (the runner defers the rest)."""
        return job.timing and self.clock is not None and not job.defer_baselines

    def _baselines(self, job: Job, entry: ProblemEntry, result: VerifyResult) -> None:
        """Eager and torch.compile times for this problem (`timed.baselines`), once this
        grader's finished candidates are gone (a process being killed may still run work)."""
        self._wait_for_reapers()
        timed.baselines(
            job,
            entry,
            result,
            self.gate,
            self.clock,
            self.config.timing_runs,
            self.config.timing_warmup,
            probe=self.idle_probe,
            settle=self._wait_for_reapers,
        )
        if self.device == "cuda":  # Inductor's leftovers, before the candidate takes its cap
            gpu.release_gpu_memory()
