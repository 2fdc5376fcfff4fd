"""The grader's handle on one candidate process: start, command, deadline, kill.

A process (forked by the grader's zygote) serves exactly one candidate and is then
killed with its whole namespace. Replies are read as bounded JSON; a process that
dies, hangs or floods is classified by how it ended (signal, exit status, cgroup
OOM) into a verdict.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

from sandbox.isolation import (
    Cgroup,
    Limits,
    cgroups_available,
    hand_over,
    namespaces_available,
)
from sandbox.launchers import LauncherCache
from sandbox.timing import SPIN_RATE_ENV
from sandbox.transfer import send_descriptors
from sandbox.zygote import Zygote

MAX_REPLY_BYTES = 1 << 20
MAX_LAUNCHER_REQUESTS = 32  # distinct kernel signatures one candidate may have built
# Replies to anything but the command in flight (a candidate writing on the pipe itself)
# are dropped, up to this many per command; past it the candidate is tampering.
MAX_STRAY_REPLIES = 16
LOG_TAIL_BYTES = 4000
REPO_ROOT = str(Path(__file__).resolve().parent.parent)


class CandidateDied(Exception):
    """The candidate process ended or overran its deadline; `verdict` says how."""

    def __init__(self, verdict: str, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def candidate_env(
    job_dir: str, device: str, spin_cycles_per_us: float | None = None
) -> dict[str, str]:
    """The whole environment of a candidate (and of the zygote, with its own directory).

    `spin_cycles_per_us` is the grader's measure of the GPU's spin rate (`sandbox.timing`),
    taken with the GPU to itself: a candidate measuring it beside busy jobs would not be.
    """
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": job_dir,
        "TMPDIR": job_dir,
        "TRITON_CACHE_DIR": os.path.join(job_dir, ".triton"),
        "PYTHONPATH": REPO_ROOT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }
    for name in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME", "TRITON_PTXAS_PATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        # One hardware queue, not eight: the driver makes a context (which every candidate
        # process must) in half the time, and one GPU starts twice as many processes a
        # second (bench/cuda_startup.py). Timed work runs on one stream either way.
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    if spin_cycles_per_us is not None:
        env[SPIN_RATE_ENV] = repr(spin_cycles_per_us)
    extra = os.environ.get("DRTRITON_CANDIDATE_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = f"{REPO_ROOT}:{extra}"
    return env


def triton_seed_dir(job_root: str) -> str:
    """Where the runner keeps Triton's compiled driver helpers, built by trusted code."""
    return os.path.join(job_root, "triton-seed")


def build_triton_seed(job_root: str, device: str) -> None:
    """Compile Triton's CUDA driver helpers once, so no candidate pays seconds of gcc for them.

    Candidates start from a copy (see CandidateProcess); a failure here only costs speed.
    """
    if device != "cuda":
        return
    seed = triton_seed_dir(job_root)
    os.makedirs(seed, exist_ok=True)
    env = candidate_env(seed, device)
    env["TRITON_CACHE_DIR"] = seed
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [sys.executable, "-c", "from triton.runtime import driver; driver.active.utils"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=300,
            check=True,
        )


# The harness's start-up steps, in order, each reported as the time it ended
# (`candidate.serve`), after `spawn` (its job directory made, the zygote's fork, up to the
# harness): the jail, CUDA's context, the timing clock, Triton's driver helpers, the reply.
STARTUP_STEPS = ("jail", "cuda_init", "clock", "triton", "ready")


class CandidateProcess:
    """One jailed candidate process, started ahead of its job."""

    def __init__(
        self,
        zygote: Zygote,
        job_root: str,
        device: str,
        limits: Limits,
        launchers: LauncherCache | None = None,
        spin_cycles_per_us: float | None = None,
    ) -> None:
        self.created = time.monotonic()
        self.device = device
        self.launchers = launchers
        self.launcher_requests = 0
        self.sequence = 0  # of the last command sent
        self.limits = limits
        self.job_dir = os.path.join(job_root, uuid.uuid4().hex[:16])
        os.makedirs(self.job_dir, mode=0o700)
        seed = triton_seed_dir(job_root)
        if os.path.isdir(seed):
            # A private copy: what one candidate writes into its cache reaches no other.
            cache = os.path.join(self.job_dir, ".triton")
            shutil.copytree(seed, cache)
            for parent, dirs, files in os.walk(cache):
                for name in (parent, *(os.path.join(parent, n) for n in dirs + files)):
                    hand_over(name)
        hand_over(self.job_dir)
        self.cgroup: Cgroup | None = None
        if cgroups_available():
            try:
                self.cgroup = Cgroup(
                    os.path.basename(self.job_dir), limits.memory_mb, limits.processes
                )
            except OSError:
                self.cgroup = None
        self.log_path = os.path.join(self.job_dir, "candidate.log")
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        hand_over(self.log_path)
        self.conn, child_conn = Pipe(duplex=True)
        try:
            self.proc = zygote.spawn(
                job_dir=self.job_dir,
                env=candidate_env(self.job_dir, device, spin_cycles_per_us),
                limits=limits,
                cgroup_dirs=[str(p) for p in self.cgroup.dirs] if self.cgroup else [],
                namespaces=namespaces_available(),
                processes=limits.processes,
                conn_fd=child_conn.fileno(),
                log_fd=log.fileno(),
            )
        except BaseException:
            self.conn.close()
            if self.cgroup is not None:
                self.cgroup.remove()
            shutil.rmtree(self.job_dir, ignore_errors=True)
            raise
        finally:
            child_conn.close()
            log.close()
        self.started = time.monotonic()
        self.ready_info: dict[str, Any] | None = None
        self.killed_for_time = False

    # -- messages -----------------------------------------------------------------
    def _receive(self, deadline: float, seq: int | None = None) -> dict[str, Any]:
        """The reply to command `seq`; launcher builds asked for on the way are served.

        The harness echoes each command's `seq`: anything else on the pipe (a reply
        the candidate forged, or the real one after it) is dropped, so every command
        is answered by its own reply.
        """
        strays = 0
        while True:
            reply = self._receive_one(deadline)
            if "build_launcher" in reply:
                self.launcher_requests += 1
                if self.launchers is None or self.launcher_requests > MAX_LAUNCHER_REQUESTS:
                    answer: dict[str, Any] = {"error": "no launcher builds here"}
                else:
                    answer = self.launchers.answer(reply, self.job_dir)
                try:
                    self.conn.send(answer)
                except (BrokenPipeError, OSError):
                    raise self._death() from None
            elif seq is None or reply.get("seq") == seq:
                return reply
            else:
                strays += 1
                if strays > MAX_STRAY_REPLIES:
                    self.kill()
                    raise CandidateDied("tampering", "the candidate wrote on the grader's pipe")

    def _receive_one(self, deadline: float) -> dict[str, Any]:
        remaining = deadline - time.monotonic()
        if (remaining <= 0 or not self.conn.poll(remaining)) and self.proc.poll() is None:
            self.killed_for_time = True
            self.kill()
            raise CandidateDied("timeout", "exceeded its time budget")
        try:
            raw = self.conn.recv_bytes(MAX_REPLY_BYTES)
        except (EOFError, OSError):
            raise self._death() from None
        try:
            reply = json.loads(raw)
        except ValueError:
            raise CandidateDied("tampering", "the candidate wrote on the grader's pipe") from None
        if not isinstance(reply, dict):
            raise CandidateDied("tampering", "the candidate wrote on the grader's pipe")
        return reply

    def wait_ready(self, deadline: float) -> dict[str, Any]:
        """Wait for the harness; no candidate code has run yet, so a failure is ours."""
        if self.ready_info is None:
            try:
                reply = self._receive(deadline)
            except CandidateDied as death:
                raise CandidateDied(
                    "sandbox_error", f"candidate process failed to start: {death.message}"
                ) from None
            if not reply.get("ready"):
                raise CandidateDied("sandbox_error", "candidate process failed to start")
            self.ready_info = reply
        return self.ready_info

    def startup_seconds(self, taken: float) -> dict[str, float]:
        """How long each step of this process's start took (`STARTUP_STEPS`, from the
        harness's "ready"), and how long it then waited for the job that took it at `taken`."""
        marks = (self.ready_info or {}).get("startup")
        if not isinstance(marks, dict):
            return {}
        seconds: dict[str, float] = {}
        last = self.created
        for name, mark in (("spawn", "serve"), *((step, step) for step in STARTUP_STEPS)):
            at = marks.get(mark)
            if isinstance(at, (int, float)):
                seconds[name], last = max(0.0, at - last), at
        seconds["idle"] = max(0.0, taken - last)
        return seconds

    def request(
        self,
        deadline: float,
        lease: tuple[float, Callable[[], None]] | None = None,
        fds: list[int] | None = None,
        **message: Any,
    ) -> dict[str, Any]:
        """Send one command and wait for its reply until `deadline`.

        `fds` (shared device buffers, `sandbox.transfer`) follow the command on the
        socket; this call closes them. With `lease=(seconds, expire)`, `expire()` is
        called once if no reply has come within `seconds` (the grader then gives up its
        shared hold on the GPU).
        """
        self.sequence += 1
        try:
            self.conn.send({**message, "seq": self.sequence, "fds": len(fds or ())})
            if fds:
                send_descriptors(self.conn.fileno(), fds)
        except (BrokenPipeError, OSError):
            raise self._death() from None
        finally:
            for fd in fds or ():
                os.close(fd)
        if lease is not None:
            seconds, expire = lease
            wait = min(seconds, deadline - time.monotonic())
            if wait <= 0 or not self.conn.poll(wait):
                expire()
        return self._receive(deadline, self.sequence)

    # -- ending ---------------------------------------------------------------------
    def _death(self) -> CandidateDied:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        log = self.log_tail()
        if self.cgroup is not None and self.cgroup.oom_killed():
            return CandidateDied("resource_limit", "killed: out of its memory limit")
        # The namespace's keeper reports its child's signal as 128 + signo.
        signo = (
            -code if code is not None and code < 0 else (code - 128 if code and code > 128 else 0)
        )
        if signo == signal.SIGXFSZ:
            return CandidateDied("resource_limit", "killed: wrote more than its file/output limit")
        if signo == signal.SIGXCPU:
            return CandidateDied("timeout", "killed: exceeded its CPU-time limit")
        if signo == signal.SIGKILL and self.killed_for_time:
            return CandidateDied("timeout", "exceeded its time budget")
        if "MemoryError" in log[-600:] or "Cannot allocate memory" in log[-600:]:
            return CandidateDied("resource_limit", "ran out of its memory limit")
        if signo:
            name = signal.Signals(signo).name if signo in signal.valid_signals() else str(signo)
            return CandidateDied("runtime_error", f"the candidate process died with {name}")
        last = next((line for line in reversed(log.splitlines()) if line.strip()), "")
        reason = f": {last.strip()[:300]}" if code and last else ""
        return CandidateDied(
            "runtime_error", f"the candidate process exited (status {code}){reason}"
        )

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - LOG_TAIL_BYTES))
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGKILL the process and everything it started; do not wait (see `close`)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def close(self) -> None:
        """Kill the process and everything it started; remove its files."""
        self.kill()
        self.conn.close()
        if self.cgroup is not None:
            for _ in range(50):
                if not any((p / "cgroup.procs").read_text().strip() for p in self.cgroup.dirs):
                    break
                time.sleep(0.02)
            self.cgroup.remove()
        shutil.rmtree(self.job_dir, ignore_errors=True)
