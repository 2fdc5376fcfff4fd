"""A fork server for candidate processes: torch and Triton imported once, a fork per job.

Importing torch and Triton costs one to two seconds of CPU per process; on a busy
host that, not the kernel, bounds how many candidates a sandbox verifies per
second. A zygote is trusted code that imports them once and forks a fresh process
per candidate. It never initialises CUDA (a forked CUDA context is unusable) and
never runs candidate code itself: each fork takes its own session, the job's cgroups
and rlimits, enters fresh pid, network, mount, IPC, UTS and cgroup namespaces, and forks
the namespace's pid 1, which builds the jail (`sandbox.isolation.enter_jail`: a minimal
root, an unprivileged user) and becomes `sandbox.candidate`. A process still serves
exactly one candidate. When a fork ends (or is killed), the zygote kills everything left
in its job's cgroups before it reports the exit: nothing a candidate started outlives it.

Each grader owns one zygote over a SOCK_SEQPACKET pair (both ends trusted):

    grader -> {"cmd": "spawn", ...} + fds [pipe to the grader, log]   (one at a time)
    zygote -> {"spawned": pid} or {"error": message}
    zygote -> {"exited": pid, "status": returncode}   (Popen's convention, any time)

The zygote exits when the grader's end closes, killing whatever it started.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict
from typing import Any

from sandbox.isolation import (
    TEST_FIRST_ACTION_ENV,
    Limits,
    apply_limits,
    enter_namespaces,
    set_first_action,
)
from sandbox.jail.cgroup import kill_all

MAX_MESSAGE = 1 << 16
ZYGOTE_START_S = 300.0
_PR_SET_PDEATHSIG = 1
# Candidates compile at a lower priority than the graders; the one being timed is
# raised above both (`Grader._time`), so a busy host does not stretch its timed loop.
CANDIDATE_NICE = 5
TIMED_NICE = -5


class ZygoteError(RuntimeError):
    """The zygote could not start a candidate process (infrastructure, not the kernel)."""


# -- inside the zygote ----------------------------------------------------------------------


def warm_compile(arch: int) -> None:
    """Compile a tiny kernel for `sm_{arch}` ahead of time, touching no GPU.

    A fork's first Triton compile then finds LLVM, MLIR's dialects, libdevice and the
    ptxas version already loaded: about 0.1 s instead of 1.5 s of CPU per candidate.
    Leaves the process single-threaded, so forking stays safe.
    """
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def warm_up(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        tl.store(out_ptr + offsets, tl.sigmoid(x) + tl.exp(x), mask=mask)

    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    source = ASTSource(warm_up, signature, {"BLOCK": 1024})
    triton.compile(source, target=GPUTarget("cuda", arch, 32))


def _preload(device: str, arch: int | None) -> str:
    """Import what every candidate needs and warm Triton's compiler, touching no GPU.

    Returns why candidates cannot run here ('' when they can): on the CPU, whether Triton's
    interpreter works with this NumPy (`sandbox.interpreter_check`).
    """
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    import sandbox.candidate  # noqa: F401
    import sandbox.guard  # noqa: F401
    from sandbox import isolation

    isolation.prepare()  # decided once here, inherited by every fork

    if device == "cuda":
        with contextlib.suppress(ImportError):
            import triton.backends.nvidia.compiler  # noqa: F401
            import triton.compiler.compiler  # noqa: F401
        if arch is not None:
            try:
                warm_compile(arch)
            except Exception as err:  # noqa: BLE001 - only speed is lost
                print(f"zygote: compiler warm-up failed: {err}", file=sys.stderr)
        return ""
    from sandbox.interpreter_check import interpreter_problem

    return interpreter_problem()


def _set_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_stderr_is_log = False  # in a fork, once `_become_candidate` has made the log its stderr


def _become_candidate(spec: dict[str, Any], conn_fd: int, log_fd: int) -> None:
    """The last steps of a fork: descriptors, environment, then the candidate harness."""
    from sandbox import candidate

    if conn_fd < 3:
        conn_fd = os.dup(conn_fd)  # keep it clear of stdin/stdout/stderr
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    global _stderr_is_log
    _stderr_is_log = True
    os.closerange(3, conn_fd)
    os.closerange(conn_fd + 1, 1 << 16)
    os.environ.clear()
    os.environ.update(spec["env"])
    import tempfile

    tempfile.tempdir = None  # computed again from this job's TMPDIR
    os.chdir(spec["job_dir"])
    candidate.serve(conn_fd, spec["job_dir"], spec["device"], spec["processes"])


def _child(spec: dict[str, Any], conn_fd: int, log_fd: int) -> None:
    """Runs in the fork; never returns."""
    code = 127
    try:
        signal.set_wakeup_fd(-1)
        for signo in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(signo, signal.SIG_DFL)
        os.setsid()
        os.nice(CANDIDATE_NICE)
        # No death signal from the zygote: should it die, the candidates in flight still
        # finish their jobs (the grader kills them by process group and watches /proc).
        for path in spec["cgroup_dirs"]:
            with open(os.path.join(path, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        apply_limits(Limits(**spec["limits"]))
        if os.environ.get(TEST_FIRST_ACTION_ENV):  # tests only (see sandbox.isolation)
            with open(os.environ[TEST_FIRST_ACTION_ENV]) as probe:
                set_first_action(probe.read())
        if spec["namespaces"]:
            enter_namespaces()
            inner = os.fork()
            if inner == 0:
                _set_death_signal()
                _become_candidate(spec, conn_fd, log_fd)  # its jail mounts its own /proc
                os._exit(0)
            # Like `unshare --fork --kill-child`: wait, then report how the child ended.
            os.close(conn_fd)
            os.close(log_fd)
            _, status = os.waitpid(inner, 0)
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status))
        _become_candidate(spec, conn_fd, log_fd)
        code = 0
    except BaseException:  # noqa: BLE001 - the fork must never return into the zygote
        # Once the log is stderr its own descriptor is closed (its number may be reused).
        with contextlib.suppress(OSError):
            os.write(2 if _stderr_is_log else log_fd, traceback.format_exc().encode())
    os._exit(code)


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def zygote_main(control_fd: int, device: str, arch: int | None) -> None:
    problem = _preload(device, arch)
    # What torch and Triton made stays out of every fork's garbage collections: a full
    # collection in a candidate would otherwise walk (and so copy, page by page) all of the
    # zygote's objects, about 0.1 s of CPU and 40 MiB per process.
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: dict[int, list[str]] = {}  # pid -> the cgroups of its job
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)

    def send(message: dict[str, Any]) -> None:
        control.send(json.dumps(message).encode())

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            # Whatever the job started dies with it, detached or not, before the grader
            # hears that it ended.
            kill_all(children.pop(pid, []))
            send({"exited": pid, "status": _returncode(status)})

    if problem:
        send({"ready": False, "error": problem})
        return
    send({"ready": True, "pid": os.getpid()})
    try:
        while True:
            for key, _ in selector.select(timeout=1.0):
                if key.fileobj is wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_r, 4096)
                    continue
                data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 2)
                if not data:
                    return
                if len(fds) != 2:
                    for fd in fds:
                        os.close(fd)
                    send({"error": "spawn needs two descriptors"})
                    continue
                conn_fd, log_fd = fds
                spec = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    control.detach()
                    _child(spec, conn_fd, log_fd)
                os.close(conn_fd)
                os.close(log_fd)
                children[pid] = [str(d) for d in spec.get("cgroup_dirs", [])]
                send({"spawned": pid})
            reap()
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        for pid, cgroups in children.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            kill_all(cgroups)


# -- the grader's side ------------------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (for children of a zygote that died)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ForkedProcess:
    """A child of the zygote, with the part of `subprocess.Popen` the grader uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status_of(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.status_of(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"candidate pid {self.pid}", timeout or 0)
        return self.returncode


class Zygote:
    """Starts and talks to one zygote process; thread-safe."""

    def __init__(self, device: str, env: dict[str, str], arch: int | None = None) -> None:
        """`arch`: the GPU's compute capability (90 for sm_90), to warm the compiler for."""
        self.device = device
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control = ours
        command = [sys.executable, "-m", "sandbox.zygote", "--fd", str(theirs.fileno())]
        command += ["--device", device] + (["--arch", str(arch)] if arch else [])
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            env=env,
            start_new_session=True,  # Ctrl-C at a terminal reaches the server, not this
        )
        theirs.close()
        self._lock = threading.Lock()  # one spawn at a time
        self._changed = threading.Condition()
        self._replies: list[dict[str, Any]] = []
        self._statuses: dict[int, int] = {}
        self._alive = True
        ours.settimeout(ZYGOTE_START_S)
        try:
            ready = json.loads(ours.recv(MAX_MESSAGE) or b"{}")
        except (OSError, ValueError):
            ready = {}
        ours.settimeout(None)
        if not ready.get("ready"):
            self.close()
            raise ZygoteError(ready.get("error") or "the candidate zygote did not start")
        threading.Thread(target=self._read, daemon=True, name="zygote-reader").start()

    @property
    def alive(self) -> bool:
        return self._alive and self.proc.poll() is None

    def _read(self) -> None:
        while True:
            try:
                data = self.control.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    self._alive = False
                    self._changed.notify_all()
                    return
                message = json.loads(data)
                if "exited" in message:
                    self._statuses[int(message["exited"])] = int(message["status"])
                else:
                    self._replies.append(message)
                self._changed.notify_all()

    def spawn(
        self,
        *,
        job_dir: str,
        env: dict[str, str],
        limits: Limits,
        cgroup_dirs: list[str],
        namespaces: bool,
        processes: int,
        conn_fd: int,
        log_fd: int,
    ) -> ForkedProcess:
        spec = {
            "cmd": "spawn",
            "job_dir": job_dir,
            "env": env,
            "limits": asdict(limits),
            "cgroup_dirs": cgroup_dirs,
            "namespaces": namespaces,
            "processes": processes,
            "device": self.device,
        }
        with self._lock:
            try:
                socket.send_fds(self.control, [json.dumps(spec).encode()], [conn_fd, log_fd])
            except OSError as err:
                raise ZygoteError(f"the candidate zygote is gone: {err}") from None
            deadline = time.monotonic() + 60
            with self._changed:
                while not self._replies:
                    left = deadline - time.monotonic()
                    if not self._alive or left <= 0:
                        raise ZygoteError("the candidate zygote stopped answering")
                    self._changed.wait(left)
                reply = self._replies.pop(0)
        if "spawned" not in reply:
            raise ZygoteError(f"the candidate zygote could not fork: {reply.get('error')}")
        return ForkedProcess(self, int(reply["spawned"]))

    def status_of(self, pid: int, timeout: float | None) -> int | None:
        """The child's return code once it has ended; None if still running after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while pid not in self._statuses:
                if not self._alive and not _running(pid):
                    # No one reports any more: the status is lost, the process is gone.
                    return self._statuses.setdefault(pid, -signal.SIGKILL)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                # Without a zygote to report, look again shortly.
                self._changed.wait(left if self._alive else min(0.05, left or 0.05))
            return self._statuses.pop(pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_RDWR)
        self.control.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Candidate fork server (started by a grader).")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--arch", type=int, default=None, help="compute capability, e.g. 90")
    args = parser.parse_args()
    zygote_main(args.fd, args.device, args.arch)


if __name__ == "__main__":
    main()
