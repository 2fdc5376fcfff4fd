"""The grader's handle on one candidate process: start, command, deadline, kill.

A process (forked by the grader's zygote) serves exactly one candidate and is then
killed with its whole namespace. Replies are read frame by frame with a deadline on every
read, within a size limit, and checked against the command's schema (`sandbox.replies`);
a process that dies, hangs or floods is classified by how it ended (signal, exit status,
cgroup OOM) into a verdict. Its job directory is the candidate's: the grader keeps its own
descriptors of what it made there (the log) and never opens a name in it again
(`sandbox.safe_fs`). Where the grader may mount, the directory is a size-limited tmpfs of
its own (`sandbox.jail.quota`), made before anything is put there and detached with the job.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

from sandbox import replies, safe_fs
from sandbox.isolation import (
    JOB_TMP_DIR,
    Cgroup,
    Limits,
    candidate_uid,
    cgroups_available,
    hand_over,
    namespaces_available,
)
from sandbox.jail import quota
from sandbox.launchers import LauncherCache
from sandbox.replies import MAX_REPLY_BYTES, MalformedReply
from sandbox.timing import SPIN_RATE_ENV
from sandbox.transfer import send_descriptors
from sandbox.zygote import Zygote

MAX_LAUNCHER_REQUESTS = 32  # distinct kernel signatures one candidate may have built
# Replies to anything but the command in flight (a candidate writing on the pipe itself)
# are dropped, up to this many per command; past it the candidate is tampering. So are
# launcher requests past the cap, each answered on the pipe (one that is never read from
# would fill it).
MAX_STRAY_REPLIES = 16
LOG_TAIL_BYTES = 4000
# A command not taken off the pipe within this long is a candidate that stopped reading it.
SEND_TIMEOUT_S = 10.0
# How long a dead candidate's exit status is awaited before the signal ending it is read
# from /proc instead: a process with a CUDA context takes seconds to finish dying.
EXIT_STATUS_WAIT_S = 0.25
EXIT_STATUS_LAST_WAIT_S = 5.0
PF_EXITING = 0x4  # /proc/<pid>/stat's flags: the task is exiting
REPO_ROOT = str(Path(__file__).resolve().parent.parent)


class CandidateDied(Exception):
    """The candidate process ended or overran its deadline; `verdict` says how."""

    def __init__(self, verdict: str, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def _extra_python_paths() -> list[str]:
    """The grader's own PYTHONPATH directories (an offline host's wheels unpacked beside the
    image's packages): candidates import from them too, and the jail binds them read-only."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return [
        path
        for path in dict.fromkeys(os.path.abspath(p) for p in entries if p)
        if path != os.path.abspath(REPO_ROOT) and os.path.isdir(path)
    ]


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
        "TMPDIR": os.path.join(job_dir, JOB_TMP_DIR),
        "TRITON_CACHE_DIR": os.path.join(job_dir, ".triton"),
        "PYTHONPATH": os.pathsep.join([REPO_ROOT, *_extra_python_paths()]),
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
        # The grader's own GPU, by a name CUDA resolves in any order and whatever other
        # GPUs' nodes are missing: the jail binds that GPU's node only
        # (`sandbox.jail.gpu_nodes`).
        named = own_gpu()
        if named is not None:
            env["CUDA_VISIBLE_DEVICES"] = named
    if spin_cycles_per_us is not None:
        env[SPIN_RATE_ENV] = repr(spin_cycles_per_us)
    extra = os.environ.get("DRTRITON_CANDIDATE_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = f"{REPO_ROOT}:{extra}"
    return env


_GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def own_gpu() -> str | None:
    """This process's CUDA device as `CUDA_VISIBLE_DEVICES` names it for certain:
    "GPU-<uuid>". None before this process has initialised CUDA (it is never initialised
    here for the sake of a name), for a MIG instance, or where CUDA gives no UUID."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    if "MIG-" in os.environ.get("CUDA_VISIBLE_DEVICES", "").upper():
        return None
    try:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
    except (RuntimeError, AssertionError):
        return None
    text = str(getattr(props, "uuid", "") or "").lower()
    named = text.replace("gpu-", "GPU-", 1) if text.startswith("gpu-") else f"GPU-{text}"
    return named if _GPU_UUID.match(named) else None


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


def make_job_dir(job_root: str, size_mb: int) -> tuple[str, bool]:
    """A fresh job directory under `job_root`, the candidate's, and whether it has a cap.

    The cap (a tmpfs of `size_mb`, where this process may mount: `sandbox.jail.quota`) comes
    first, so everything put there counts against it; then a private copy of Triton's seed
    cache (what one candidate writes into its cache reaches no other).
    """
    job_dir = os.path.join(job_root, uuid.uuid4().hex[:16])
    os.makedirs(job_dir, mode=0o700)
    bounded = quota.mount(job_dir, size_mb, candidate_uid())
    try:
        seed = triton_seed_dir(job_root)
        if os.path.isdir(seed):
            cache = os.path.join(job_dir, ".triton")
            shutil.copytree(seed, cache)
            for parent, dirs, files in os.walk(cache):
                for name in (parent, *(os.path.join(parent, n) for n in dirs + files)):
                    hand_over(name)
        scratch = os.path.join(job_dir, JOB_TMP_DIR)
        os.makedirs(scratch, mode=0o700, exist_ok=True)
        hand_over(scratch)
        hand_over(job_dir)
    except BaseException:
        quota.release(job_dir)
        safe_fs.remove_tree(job_dir)
        raise
    return job_dir, bounded


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
        self.job_dir, self.bounded = make_job_dir(job_root, limits.job_dir_mb)
        self.cgroup: Cgroup | None = None
        if cgroups_available():
            try:
                self.cgroup = Cgroup(
                    os.path.basename(self.job_dir), limits.memory_mb, limits.processes
                )
            except OSError:
                self.cgroup = None
        self.log_path = os.path.join(self.job_dir, "candidate.log")
        # Written by the candidate (its stdout and stderr), read by the grader through this
        # same descriptor: whatever the name comes to point to, the grader reads its file.
        self.dir_fd = safe_fs.open_dir(self.job_dir)
        self.log_fd = safe_fs.create_file(self.dir_fd, "candidate.log")
        safe_fs.hand_over(self.log_fd)
        self.conn, child_conn = Pipe(duplex=True)
        _limit_sends(self.conn.fileno(), SEND_TIMEOUT_S)
        try:
            self.proc = zygote.spawn(
                job_dir=self.job_dir,
                env=candidate_env(self.job_dir, device, spin_cycles_per_us),
                limits=limits,
                cgroup_dirs=[str(p) for p in self.cgroup.dirs] if self.cgroup else [],
                namespaces=namespaces_available(),
                processes=limits.processes,
                conn_fd=child_conn.fileno(),
                log_fd=self.log_fd,
            )
        except BaseException:
            self.conn.close()
            os.close(self.log_fd)
            os.close(self.dir_fd)
            if self.cgroup is not None:
                self.cgroup.remove()
            quota.release(self.job_dir)
            safe_fs.remove_tree(self.job_dir)
            raise
        finally:
            child_conn.close()
        self.started = time.monotonic()
        self.ready_info: dict[str, Any] | None = None
        self.killed_for_time = False

    # -- messages -----------------------------------------------------------------
    def _receive(
        self, deadline: float, seq: int | None = None, on_mark: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """The reply to command `seq`; launcher builds asked for on the way are served, and
        the first loop mark of command `seq` goes to `on_mark`.

        The harness echoes each command's `seq`: anything else on the pipe (a reply
        the candidate forged, or the real one after it) is dropped, so every command
        is answered by its own reply.
        """
        strays = 0
        while True:
            reply = self._receive_one(deadline)
            if replies.is_launcher_request(reply):
                self.launcher_requests += 1
                if self.launcher_requests > MAX_LAUNCHER_REQUESTS + MAX_STRAY_REPLIES:
                    self.stop()
                    raise CandidateDied("tampering", "the candidate flooded the grader's pipe")
                if self.launchers is None or self.launcher_requests > MAX_LAUNCHER_REQUESTS:
                    answer: dict[str, Any] = {"error": "no launcher builds here"}
                else:
                    answer = self.launchers.answer(reply, self.job_dir)
                try:
                    self.conn.send(answer)
                except (BlockingIOError, TimeoutError):
                    raise self._stopped_reading() from None
                except OSError:
                    raise self._death() from None
            elif on_mark is not None and replies.is_loop_mark(reply) and reply["loop_done"] == seq:
                on_mark()
                on_mark = None
            elif seq is None or reply.get("seq") == seq:
                return reply
            else:
                strays += 1
                if strays > MAX_STRAY_REPLIES:
                    self.stop()
                    raise CandidateDied("tampering", "the candidate wrote on the grader's pipe")

    def _receive_one(self, deadline: float) -> dict[str, Any]:
        """One message from the harness, parsed within `sandbox.replies`' limits."""
        header = self._read_exact(4, deadline)
        (size,) = struct.unpack("!i", header)
        if size == -1:  # multiprocessing's header of a message over 2 GiB
            (size,) = struct.unpack("!Q", self._read_exact(8, deadline))
        if not 0 <= size <= MAX_REPLY_BYTES:
            self.stop()
            raise MalformedReply(f"a message of {size} bytes, more than {MAX_REPLY_BYTES}")
        return replies.parse(self._read_exact(size, deadline))

    def _read_exact(self, count: int, deadline: float) -> bytes:
        """`count` bytes from the pipe, each wait bounded by `deadline` (a message sent in
        part and never finished is a timeout, not a grader stuck reading)."""
        data = bytearray()
        watch = select.poll()
        watch.register(self.conn.fileno(), select.POLLIN)
        while len(data) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not watch.poll(remaining * 1e3):
                if self.proc.poll() is not None:  # gone, its pipe held open by another
                    raise self._death()
                self.killed_for_time = True
                self.stop()
                raise CandidateDied("timeout", "exceeded its time budget")
            try:
                chunk = os.read(self.conn.fileno(), count - len(data))  # ready: never blocks
            except OSError:
                chunk = b""
            if not chunk:
                raise self._death()
            data += chunk
        return bytes(data)

    def wait_ready(self, deadline: float) -> dict[str, Any]:
        """Wait for the harness; no candidate code has run yet, so a failure is ours."""
        if self.ready_info is None:
            try:
                self.ready_info = replies.check_ready(self._receive(deadline))
            except (CandidateDied, MalformedReply) as failure:
                raise CandidateDied(
                    "sandbox_error", f"candidate process failed to start: {failure.message}"
                ) from None
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
        on_mark: Callable[[], None] | None = None,
        **message: Any,
    ) -> dict[str, Any]:
        """Send one command and wait for its reply until `deadline`: a reply the harness
        could send to it (`sandbox.replies.check`), or MalformedReply.

        `on_mark` is called when the harness marks the end of a host-clock loop (before
        its own checks, which the loop's time should not include; `sandbox.replies`).

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
        except (BlockingIOError, TimeoutError):  # no room on the pipe for `SEND_TIMEOUT_S`
            raise self._stopped_reading() from None
        except OSError:
            raise self._death() from None
        finally:
            for fd in fds or ():
                os.close(fd)
        if lease is not None:
            seconds, expire = lease
            wait = min(seconds, deadline - time.monotonic())
            if wait <= 0 or not self.conn.poll(wait):
                expire()
        return replies.check(message, self._receive(deadline, self.sequence, on_mark))

    # -- ending ---------------------------------------------------------------------
    def _stopped_reading(self) -> CandidateDied:
        """A candidate that left the grader's messages on the pipe (`SEND_TIMEOUT_S`)."""
        self.stop()
        return CandidateDied("tampering", "the candidate stopped taking the grader's commands")

    def _death(self) -> CandidateDied:
        code = self._exit_code()
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

    def _exit_code(self) -> int | None:
        """How the process that closed its pipe ended (`subprocess.Popen.returncode`'s form).

        The zygote reports it once the process is gone, which for one with a CUDA context
        takes seconds after its last instruction ran; by then /proc shows the code it is
        exiting with (a fatal signal, at once), which is read instead, and the process is
        left to the reaper.
        """
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=EXIT_STATUS_WAIT_S)
        dying = exiting_status(self.proc.pid)
        if dying is not None:
            self.stop()
            return dying
        try:
            return self.proc.wait(timeout=EXIT_STATUS_LAST_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def log_tail(self) -> str:
        """The end of what the candidate wrote to stdout and stderr (its log), read through
        the grader's own descriptor of it."""
        try:
            return safe_fs.read_tail(self.log_fd, LOG_TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""

    def log_bytes(self) -> int:
        """How large the candidate's log is (it may have cut it: at most what it wrote)."""
        try:
            info = os.fstat(self.log_fd)
        except OSError:
            return 0
        return info.st_size if stat.S_ISREG(info.st_mode) else 0

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
        for fd in (self.log_fd, self.dir_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.cgroup is not None:
            # Whatever the candidate started (setsid, double forks) dies with its cgroup,
            # even when the zygote that would have killed it is gone.
            with contextlib.suppress(OSError):
                self.cgroup.kill()
            for _ in range(50):
                if not any((p / "cgroup.procs").read_text().strip() for p in self.cgroup.dirs):
                    break
                time.sleep(0.02)
            self.cgroup.remove()
        quota.release(self.job_dir)  # the job's files go with its tmpfs
        if not safe_fs.remove_tree(self.job_dir):
            print(f"drtriton grader: could not remove {self.job_dir}", file=sys.stderr)


def exiting_status(pid: int) -> int | None:
    """The status a process (or the candidate under its namespace's keeper) is exiting
    with, in `subprocess.Popen.returncode`'s form; None if none is exiting yet.

    Read from /proc/<pid>/stat (its flags and exit code, which the kernel sets as the
    process starts to exit, before it lets go of its memory and devices).
    """
    for task in (pid, *_children(pid)):
        try:
            with open(f"/proc/{task}/stat", "rb") as handle:
                fields = handle.read(4096).rsplit(b")", 1)[1].split()
            flags, code = int(fields[6]), int(fields[49])
        except (OSError, IndexError, ValueError):
            continue
        if flags & PF_EXITING and code:
            return -(code & 0x7F) if code & 0x7F else (code >> 8) & 0xFF
    return None


def _children(pid: int) -> list[int]:
    """The children of `pid`'s main thread (the candidate, under its namespace's keeper)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as handle:
            return [int(child) for child in handle.read(4096).split()]
    except (OSError, ValueError):
        return []


def _limit_sends(fd: int, seconds: float) -> None:
    """Sends on the socket `fd` fail after `seconds` without room, rather than block."""
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    with socket.socket(fileno=os.dup(fd)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
