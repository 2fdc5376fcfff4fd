"""JobRunner: the asyncio front of a sandbox, shared by the gRPC server and local use.

It owns `workers` grader worker processes (each grading one job at a time), a
bounded queue in front of them, the isolation report, and draining. Everything a
candidate can do wrong comes back as a verdict; only infrastructure problems
(queue full, draining, malformed request) raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from sandbox import placement, safe_fs
from sandbox.config import MAX_TRIALS, SandboxConfig, resolve_device
from sandbox.errors import (
    DrainingError,
    InvalidRequestError,
    QueueFullError,
    SandboxInfrastructureError,
    WeakIsolationError,
)
from sandbox.jail import quota
from sandbox.jail.sweep import sweep
from sandbox.problem import source_key
from sandbox.process import REPO_ROOT, build_triton_seed, triton_seed_dir
from sandbox.result import TrialOutcome, VerifyResult
from sandbox.static_checks import MAX_SOURCE_BYTES

_FORMATS = {
    pb.FORMAT_AUTO: "auto",
    pb.FORMAT_FUNCTIONAL: "functional",
    pb.FORMAT_KERNELBENCH: "kernelbench",
}
_BASELINES = {pb.EAGER: "eager", pb.TORCH_COMPILE: "torch_compile"}
# Extra seconds a grader may take beyond a job's budget (reference, bookkeeping).
GRADER_GRACE_S = 60.0
# `Connection.poll` takes at most 2**31 ms; no job waits anywhere near that.
MAX_REPLY_WAIT_S = 24 * 3600.0
# Trial and timing inputs are drawn from seed + small offsets; torch seeds are 64-bit.
MAX_SEED = 2**48
# A request id is echoed and written to the audit log: an identifier, not a payload.
MAX_REQUEST_ID_CHARS = 256
WORKER_START_S = 600.0


def job_from_request(
    request: pb.VerifyRequest, config: SandboxConfig, timeout_s: float | None
) -> dict[str, Any]:
    """Validate a request and turn it into the grader's job fields."""
    if not request.problem.strip():
        raise InvalidRequestError("problem source is empty")
    if not request.candidate.strip():
        raise InvalidRequestError("candidate source is empty")
    if len(request.problem.encode()) > MAX_SOURCE_BYTES:
        raise InvalidRequestError(f"problem source is larger than {MAX_SOURCE_BYTES} bytes")
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequestError(f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters")
    if request.format not in _FORMATS:
        raise InvalidRequestError(f"unknown problem format {request.format}")
    options = request.options
    trials = options.trials or 5
    if trials > MAX_TRIALS:
        raise InvalidRequestError(f"trials must be at most {MAX_TRIALS}")
    for name in ("atol", "rtol"):
        if options.HasField(name):
            value = getattr(options, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidRequestError(f"{name} must be a finite number >= 0")
    if options.time_budget_s < 0 or not math.isfinite(options.time_budget_s):
        raise InvalidRequestError("time_budget_s must be >= 0")
    if options.HasField("seed") and options.seed >= MAX_SEED:
        raise InvalidRequestError(f"seed must be below 2**{MAX_SEED.bit_length() - 1}")
    # The server's job timeout is the default and the most a request may ask for.
    budget = min(options.time_budget_s or config.job_timeout_s, config.job_timeout_s)
    if timeout_s is not None:
        budget = min(budget, max(0.5, timeout_s - 0.5))
    baselines = tuple(_BASELINES[b] for b in options.baselines if b in _BASELINES) or (
        "eager",
        "torch_compile",
    )
    return {
        "problem": request.problem,
        "candidate": request.candidate,
        "request_id": request.request_id,
        "format": _FORMATS[request.format],
        "trials": trials,
        "atol": options.atol if options.HasField("atol") else None,
        "rtol": options.rtol if options.HasField("rtol") else None,
        "timing": options.timing if options.HasField("timing") else True,
        "baselines": baselines,
        "budget_s": budget,
        "seed": options.seed if options.HasField("seed") else None,
    }


def result_from_dict(data: dict[str, Any]) -> VerifyResult:
    data = dict(data)
    data["trials"] = [TrialOutcome(**t) for t in data.get("trials", [])]
    return VerifyResult(**data)


class _Worker:
    """The runner's side of one grader worker process."""

    def __init__(
        self, config: SandboxConfig, device: str, probe: bool, gpu: str | None = None
    ) -> None:
        self.config = config
        self.gpu = gpu
        self.conn, child = multiprocessing.Pipe(duplex=True)
        fd = child.fileno()
        command = [sys.executable, "-m", "sandbox.worker", "--fd", str(fd), "--device", device]
        command += ["--config", json.dumps(dataclasses.asdict(config))]
        if probe:
            command.append("--probe")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu  # its candidates inherit it
        # torch.compile in each grader: one pool of compile subprocesses per worker would
        # put workers x cores processes on the host; the workers are the parallelism.
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        # Blocks above 256 MiB are never split: a small long-lived allocation (a cuBLAS
        # workspace, a cached kernel's buffer) carved from a freed GiB block would pin the
        # whole block, outside every job's GPU memory reservation.
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
        # Likewise for CPU tensor work: N graders each with a thread per core thrash.
        threads = str(max(1, (os.cpu_count() or 1) // max(1, config.workers)))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, threads)
        self.process = subprocess.Popen(command, pass_fds=(fd,), stdin=subprocess.DEVNULL, env=env)
        child.close()
        self.ready: dict[str, Any] = {}
        self._seq = 0  # jobs sent; each reply must echo its job's number

    def wait_ready(self) -> dict[str, Any]:
        if not self.conn.poll(WORKER_START_S):
            raise SandboxInfrastructureError("grader worker did not start")
        try:
            self.ready = self.conn.recv()
        except EOFError:
            raise SandboxInfrastructureError("grader worker exited while starting") from None
        if not self.ready.get("ready"):
            raise SandboxInfrastructureError(self.ready.get("error") or "grader worker failed")
        return self.ready

    def grade(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send one job and wait for its reply. Anything unexpected (a silent worker, a
        reply out of step with the job) is the worker's loss: it is then replaced, never
        given another job while it might still answer an earlier one."""
        self._seq += 1
        self.conn.send({**job, "seq": self._seq})
        wait_s = min(job["budget_s"] + GRADER_GRACE_S, MAX_REPLY_WAIT_S)
        if not self.conn.poll(wait_s):
            raise SandboxInfrastructureError("grader worker stopped answering")
        reply = self.conn.recv()
        if not isinstance(reply, dict) or reply.get("seq") != self._seq:
            raise SandboxInfrastructureError("grader worker answered out of step")
        return reply

    def kill(self) -> None:
        import psutil

        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        self.process.kill()
        self.process.wait(5)

    def request_stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)

    def wait_stopped(self, timeout_s: float = 30) -> None:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


def _copy_seed(source_root: str, target_root: str) -> None:
    """Give another job root the Triton seed built in `source_root` (none: nothing to copy)."""
    source = triton_seed_dir(source_root)
    if os.path.isdir(source):
        shutil.copytree(source, triton_seed_dir(target_root), dirs_exist_ok=True)


class JobRunner:
    def __init__(self, config: SandboxConfig) -> None:
        # Each runner keeps its jobs in a directory of its own, removed at close.
        self.job_root = os.path.join(config.job_root, f"runner-{os.getpid()}-{os.urandom(3).hex()}")
        self.config = dataclasses.replace(config, job_root=self.job_root)
        self.device = resolve_device(config.device)
        self._idle: asyncio.Queue[_Worker] | None = None
        self._workers: list[_Worker] = []
        self._pending = 0
        self._busy = 0
        self._jobs_done = 0
        self._draining = False
        self._health_problem = ""
        self._features: list[dict[str, Any]] = []
        self._provenance: dict[str, Any] = {}
        self._threads = ThreadPoolExecutor(
            max_workers=config.workers + 2, thread_name_prefix="grader"
        )
        self._idle_event: asyncio.Event | None = None
        self.gpu_shares: list[tuple[str, int]] = []  # (GPU, its workers), once started
        # Baseline times per problem, shared by all graders (torch.compile costs seconds),
        # and the problems whose baselines one job is measuring right now.
        self._baselines: dict[str, dict[str, float | None]] = {}
        self._measuring: dict[str, asyncio.Future[dict[str, float | None] | None]] = {}

    # -- life cycle ---------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Queue()
        self._idle_event = asyncio.Event()
        self._idle_event.set()
        # Job roots, tmpfs mounts and cgroups of sandboxes killed without cleaning up.
        await loop.run_in_executor(self._threads, sweep, os.path.dirname(self.job_root))
        groups = self._gpu_groups()
        self.gpu_shares = [(gpu, config.workers) for gpu, config in groups if gpu is not None]
        first_root = groups[0][1].job_root
        await loop.run_in_executor(self._threads, build_triton_seed, first_root, self.device)
        for _, config in groups[1:]:  # the same helpers for every GPU: built once, copied
            await loop.run_in_executor(self._threads, _copy_seed, first_root, config.job_root)
        workers = [
            _Worker(config, self.device, probe=(not i and not n), gpu=gpu)
            for i, (gpu, config) in enumerate(groups)
            for n in range(config.workers)
        ]
        self._workers = workers
        try:
            readies = await asyncio.gather(
                *(loop.run_in_executor(self._threads, w.wait_ready) for w in workers)
            )
        except BaseException:
            await self.close()  # the workers that did start go too
            raise
        self._features = readies[0].get("features", [])
        self._provenance = readies[0].get("provenance", {})
        self._health_problem = next((r["health"] for r in readies if r.get("health")), "")
        missing = [f for f in self._features if not f["available"]]
        if missing and not self.config.allow_weak_isolation:
            await self.close()
            names = ", ".join(f"{f['name']} ({f['detail']})" for f in missing)
            raise WeakIsolationError(
                f"this host lacks isolation features: {names}; "
                "start with --allow-weak-isolation to accept weaker isolation"
            )
        for worker in workers:
            self._idle.put_nowait(worker)

    def _gpu_groups(self) -> list[tuple[str | None, SandboxConfig]]:
        """Each GPU's workers: (its CUDA_VISIBLE_DEVICES name, their config). With several
        GPUs each has its own job root, hence its own timing gate and memory budget."""
        if self.device != "cuda":
            if self.config.gpus:
                raise ValueError("GPUs were chosen, but this sandbox runs on the CPU")
            return [(None, self.config)]
        gpus = placement.choose_gpus(self.config.gpus, placement.visible_gpus())
        shares = placement.spread(self.config.workers, gpus)
        if len(shares) == 1:
            return [(shares[0][0], self.config)]
        return [
            (
                gpu,
                dataclasses.replace(
                    self.config, workers=count, job_root=os.path.join(self.job_root, f"gpu-{gpu}")
                ),
            )
            for gpu, count in shares
        ]

    def abort(self) -> None:
        """Kill every worker now (a start-up cut short by a signal); `close` still cleans up."""
        self._draining = True
        for worker in self._workers:
            worker.kill()

    async def drain(self) -> None:
        self._draining = True
        if self._idle_event is not None:
            await self._idle_event.wait()

    async def close(self) -> None:
        self._draining = True
        # No executor here: close() also runs at interpreter exit, when executors
        # refuse new work. Workers stop in parallel: ask all, then wait for each.
        for worker in self._workers:
            worker.request_stop()
        for worker in self._workers:
            worker.wait_stopped()
        self._workers = []
        self._threads.shutdown(wait=False)
        quota.release_below(self.job_root)  # job tmpfs a worker that died left mounted
        safe_fs.remove_tree(self.job_root)  # job directories a candidate left are its own

    # -- state ----------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return not self._health_problem and not self._draining

    @property
    def isolation_features(self) -> list[dict[str, Any]]:
        return list(self._features)

    def info(self) -> pb.GetInfoResponse:
        return pb.GetInfoResponse(
            provenance=pb.Provenance(**self._provenance) if self._provenance else None,
            mode=self.device,
            workers=len(self._workers),
            busy_workers=self._busy,
            queue_depth=max(0, self._pending - self._busy),
            queue_capacity=self.config.queue_capacity,
            isolation=[pb.IsolationFeature(**f) for f in self._features],
            weak_isolation_accepted=self.config.allow_weak_isolation,
            serving=self.healthy,
            jobs_done=self._jobs_done,
        )

    # -- jobs -------------------------------------------------------------------------
    async def verify(
        self, request: pb.VerifyRequest, timeout_s: float | None = None
    ) -> VerifyResult:
        if self._draining:
            raise DrainingError("the sandbox is draining")
        assert self._idle is not None and self._idle_event is not None, "call start() first"
        job = job_from_request(request, self.config, timeout_s)
        if self._pending >= len(self._workers) + self.config.queue_capacity:
            raise QueueFullError(f"queue full ({self.config.queue_capacity} waiting)")
        self._pending += 1
        self._idle_event.clear()
        queued_at = time.monotonic()
        try:
            worker = await self._idle.get()
            waited = time.monotonic() - queued_at
            if timeout_s is not None and waited >= timeout_s - 0.5:
                self._idle.put_nowait(worker)
                return VerifyResult(
                    verdict="timeout",
                    request_id=job["request_id"],
                    message="deadline passed while queued",
                )
            if timeout_s is not None:
                job["budget_s"] = min(job["budget_s"], max(0.5, timeout_s - waited - 0.5))
            problem_key = source_key(job["problem"] + job["format"])
            job["known_baselines"] = dict(self._baselines.get(problem_key, {}))
            already_measuring = problem_key in self._measuring
            waiting_for = self._claim_baselines(problem_key, job)
            # The job that has just opened the measurement is the one that publishes it.
            owner = not already_measuring and problem_key in self._measuring
            # The grading task owns the worker until the worker answers, even when
            # this call is cancelled (a client's deadline): a worker never receives a
            # job while it still owes the previous reply.
            task = asyncio.ensure_future(self._grade_on(worker, job))
            if owner:
                task.add_done_callback(lambda done: self._release_baselines(problem_key, done))
            outcome = await asyncio.shield(task)
            if isinstance(outcome, VerifyResult):
                return outcome
            reply = outcome
            if reply.get("health"):
                self._health_problem = reply["health"]
            self._jobs_done += 1
            result = result_from_dict(reply["result"])
            result.stage_seconds["queue"] = waited
            if waiting_for is not None:
                await self._add_deferred_baselines(result, job, waiting_for, queued_at, timeout_s)
            return result
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle_event.set()

    # -- baselines: measured once per problem, by the first job that needs them -----------
    def _claim_baselines(
        self, key: str, job: dict[str, Any]
    ) -> asyncio.Future[dict[str, float | None] | None] | None:
        """The measurement to wait for when another job is measuring this problem's baselines.

        The first timed job of a problem measures them (torch.compile takes seconds of
        CPU); jobs of the same problem that start meanwhile skip them and are given them
        when that job is done. An RL group sends its samples of one prompt at once.
        """
        if self.device != "cuda" or not job["timing"] or job["known_baselines"]:
            return None
        pending = self._measuring.get(key)
        if pending is not None:
            job["defer_baselines"] = True
            return pending
        self._measuring[key] = asyncio.get_running_loop().create_future()
        return None

    def _release_baselines(self, key: str, task: asyncio.Future[Any]) -> None:
        """Publish the owner's baselines (or none) to the jobs waiting for them."""
        pending = self._measuring.pop(key, None)
        measured: dict[str, float | None] | None = None
        if not task.cancelled() and task.exception() is None and isinstance(task.result(), dict):
            data = task.result()["result"]
            if data.get("eager_ms") is not None or data.get("compile_ms") is not None:
                measured = {"eager": data.get("eager_ms"), "torch_compile": data.get("compile_ms")}
                self._baselines[key] = measured
                while len(self._baselines) > 4096:
                    self._baselines.pop(next(iter(self._baselines)))
        if pending is not None and not pending.done():
            pending.set_result(measured)

    async def _add_deferred_baselines(
        self,
        result: VerifyResult,
        job: dict[str, Any],
        waiting_for: asyncio.Future[dict[str, float | None] | None],
        queued_at: float,
        timeout_s: float | None,
    ) -> None:
        left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - queued_at))
        with contextlib.suppress(asyncio.TimeoutError):
            measured = await asyncio.wait_for(asyncio.shield(waiting_for), left)
            if measured:
                result.apply_baselines(
                    measured.get("eager") if "eager" in job["baselines"] else None,
                    measured.get("torch_compile") if "torch_compile" in job["baselines"] else None,
                    self.config.speedup_sanity_bound,
                )

    async def _grade_on(
        self, worker: _Worker, job: dict[str, Any]
    ) -> dict[str, Any] | VerifyResult:
        assert self._idle is not None
        self._busy += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._threads, worker.grade, job
            )
        except Exception as err:  # any failure after the send leaves the worker out of step
            worker = await self._replace(worker)
            return VerifyResult(
                verdict="sandbox_error", request_id=job["request_id"], message=f"grader lost: {err}"
            )
        finally:
            self._busy -= 1
            self._idle.put_nowait(worker)

    async def _replace(self, worker: _Worker) -> _Worker:
        """Kill a worker that failed and start a fresh one in its place."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, worker.kill)
        fresh = _Worker(worker.config, self.device, probe=False, gpu=worker.gpu)
        await loop.run_in_executor(self._threads, fresh.wait_ready)
        self._workers = [fresh if w is worker else w for w in self._workers]
        return fresh
