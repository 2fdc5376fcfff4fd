"""Real sandbox servers on loopback for the tests, and the sources they judge.

`sandbox_server` is one `drtriton sandbox serve --port 0 --device cpu --workers 2`
subprocess for the whole session; tests that need a server of their own (a tiny
queue, draining, a late start) use `start_server`. Every server is stopped with
SIGTERM and must exit 0.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest

from sandbox.client import SandboxClient

if TYPE_CHECKING:
    from sandbox.api import LocalSandbox

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 90.0


@functools.cache
def cpu_interpreter_problem() -> str:
    """Why Triton's interpreter cannot run kernels here ('' when it can): CPU zygotes refuse."""
    check = "from sandbox.interpreter_check import interpreter_problem as p; print(p())"
    proc = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
        cwd=REPO_ROOT,
        timeout=120,
        check=True,
    )
    return proc.stdout.strip()


@pytest.fixture
def cpu_candidates() -> None:
    """For tests that start CPU candidate processes: skipped, with the reason, on a host whose
    interpreter cannot run (a GPU host's own NumPy, say); CI's pinned NumPy runs them."""
    problem = cpu_interpreter_problem()
    if problem:
        pytest.skip(problem)


# -- sources -------------------------------------------------------------------------------

RELU_PROBLEM = """\
import torch


def get_inputs():
    tensor_0 = torch.randn([32, 64], dtype=torch.float32)
    return [tensor_0]


def fused_operator(tensor_0):
    tensor_1 = torch.relu(tensor_0)
    return [tensor_1]
"""

_KERNEL = """\
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, {value}, mask=mask)

"""

_LAUNCH = """\
    out = torch.empty_like(tensor_0)
    n = tensor_0.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](tensor_0, out, n, BLOCK=1024)
    return [out]
"""

GOOD_RELU = _KERNEL.format(value="tl.maximum(x, 0.0)") + (
    "\ndef triton_fused_operator(tensor_0):\n" + _LAUNCH
)
# Runs fine, answers wrong (identity instead of relu).
WRONG_RELU = _KERNEL.format(value="x") + "\ndef triton_fused_operator(tensor_0):\n" + _LAUNCH
# Raises while running.
CRASHING = _KERNEL.format(value="tl.maximum(x, 0.0)") + (
    '\ndef triton_fused_operator(tensor_0):\n    raise RuntimeError("boom")\n'
)
# Kills its own process (with nothing the static gate refuses: a kernel's wild read, which
# under the CPU interpreter is a segfault and on a GPU an illegal address).
ABORTING = _KERNEL.format(value="tl.maximum(x, 0.0)") + (
    "\n@triton.jit\ndef wild_read(out_ptr):\n    tl.store(out_ptr, tl.load(out_ptr + (1 << 40)))\n"
    "\n\ndef triton_fused_operator(tensor_0):\n    out = torch.empty_like(tensor_0)\n"
    "    wild_read[(1,)](out)\n    return [out]\n"
)
# Never returns: only the wall-clock budget (or a deadline) ends it.
HANGING = _KERNEL.format(value="tl.maximum(x, 0.0)") + (
    "\ndef triton_fused_operator(tensor_0):\n    while True:\n        pass\n"
)
# Correct, but takes a few seconds to import: a job that stays in flight for a while (a
# constant computed at import: the static gate allows no other module-level work).
SLOW_GOOD_RELU = "_IMPORT_DELAY = sum(range(200_000_000))\n" + GOOD_RELU
SYNTAX_ERROR = "def triton_fused_operator(tensor_0:\n    return [tensor_0]\n"
NO_ENTRY_POINT = _KERNEL.format(value="tl.maximum(x, 0.0)")
NO_TRITON_KERNEL = (
    "import torch\n\n\ndef triton_fused_operator(tensor_0):\n    return [torch.relu(tensor_0)]\n"
)

# -- servers ---------------------------------------------------------------------------------


class ServerProcess:
    """A `drtriton sandbox serve` subprocess; the port comes from its first stdout line."""

    def __init__(self, *args: str, port: int = 0) -> None:
        self.args = [
            sys.executable,
            "-m",
            "drtriton_cli",
            "sandbox",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ]
        self.proc = subprocess.Popen(
            self.args,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.stdout_lines: queue.Queue[str | None] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.port = 0

    def _pump(self, stream: Any, is_stdout: bool) -> None:
        for line in stream:
            if is_stdout:
                self.stdout.append(line)
                self.stdout_lines.put(line)
            else:
                self.stderr.append(line)
        if is_stdout:
            self.stdout_lines.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def first_line(self, timeout_s: float = START_TIMEOUT_S) -> str | None:
        """The first stdout line, or None when the server exited without printing one."""
        try:
            return self.stdout_lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(
                f"server printed nothing in {timeout_s:.0f}s; stderr: {''.join(self.stderr)}"
            ) from None

    def wait_listening(self, timeout_s: float = START_TIMEOUT_S) -> str:
        line = self.first_line(timeout_s)
        if line is None:
            self.proc.wait(10)
            raise AssertionError(
                f"server exited ({self.proc.returncode}) before listening: {''.join(self.stderr)}"
            )
        prefix = "listening on "
        assert line.startswith(prefix), f"unexpected first line {line!r}"
        self.port = int(line[len(prefix) :].strip().rsplit(":", 1)[1])
        return self.target

    def wait_exit(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server did not exit within {timeout_s:.0f}s") from None
        for reader in self._readers:
            reader.join(5)
        return code

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (drain), then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill(self) -> None:
        """Last resort: the server and everything it started."""
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(self.pid).children(recursive=True)
            for child in tree:
                with contextlib.suppress(psutil.Error):
                    child.kill()
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait(10)


def server_args(workers: int = 2, queue_capacity: int | None = None, *extra: str) -> list[str]:
    # The escape tests need the full jail, so weaker isolation is accepted only when
    # asked for (DRTRITON_TEST_WEAK_ISOLATION=1, e.g. a developer laptop without root).
    # DRTRITON_TEST_DEVICE=cuda runs the same suites against a GPU sandbox.
    device = os.environ.get("DRTRITON_TEST_DEVICE", "cpu")
    args = ["--device", device, "--workers", str(workers)]
    if os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1":
        args.append("--allow-weak-isolation")
    if queue_capacity is not None:
        args += ["--queue", str(queue_capacity)]
    return args + list(extra)


@contextlib.contextmanager
def running_server(
    workers: int = 2, queue_capacity: int | None = None, *extra: str, port: int = 0
) -> Iterator[ServerProcess]:
    """A server of a test's own; it must drain and exit 0 at the end."""
    server = ServerProcess(*server_args(workers, queue_capacity, *extra), port=port)
    try:
        server.wait_listening()
        yield server
    except BaseException:
        server.kill()
        raise
    code = server.terminate()
    assert code == 0, f"server exited {code}: {''.join(server.stderr)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll an observable condition (server state) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_usage(pid: int) -> tuple[int, int]:
    """(live processes, total RSS in bytes) of a server and all it started."""
    count, rss = 0, 0
    for proc in process_tree(pid):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            rss += proc.memory_info().rss
            count += 1
    return count, rss


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sandbox_server_process() -> Iterator[ServerProcess]:
    """`drtriton sandbox serve --port 0 --device cpu --workers 2` for the whole session."""
    with running_server(workers=2) as server:
        yield server


@pytest.fixture(scope="session")
def sandbox_server(sandbox_server_process: ServerProcess) -> str:
    """The session server's target, "127.0.0.1:PORT"."""
    return sandbox_server_process.target


@pytest.fixture(scope="session")
def sandbox_client(sandbox_server: str) -> Iterator[SandboxClient]:
    with SandboxClient(sandbox_server, timeout_s=120) as client:
        yield client


@pytest.fixture(scope="session")
def ungated_sandbox() -> Iterator[LocalSandbox]:
    """A local sandbox (one worker, the session server's device and isolation) with the
    static gate off: for tests of the checks behind it, with candidates the gate refuses."""
    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig

    device = os.environ.get("DRTRITON_TEST_DEVICE", "cpu")
    if device == "cpu" and cpu_interpreter_problem():
        pytest.skip(cpu_interpreter_problem())
    weak = os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1"
    config = SandboxConfig(device=device, workers=1, allow_weak_isolation=weak, static_gate=False)
    with LocalSandbox(config) as sandbox:
        yield sandbox
