"""Cheating and broken candidates against a real sandbox server: each gets its verdict.

The cases live in `tests/sandbox/cases/` (see `cases/manifest.py`): one candidate file
per attempt, its expected verdict in its first line. They are submitted with
`timing=False` to the session's `drtriton sandbox serve --device cpu --workers 2`,
two at a time so that both workers stay busy. Escape attempts (network, files
outside the job directory, processes that outlive the job) are templates filled in
here and judged by what happened on the host, not only by their verdict; they, and the
cases whose defence behind the static gate is the process's limits, also run through a
local sandbox with the gate off (`SandboxConfig.static_gate`), so that what stands behind
it is shown to hold. The last test checks that the server is still healthy and still
grades a good kernel.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.client import SandboxClient
from sandbox.result import VerifyResult
from tests.sandbox.cases.manifest import Case, check_manifest, load_cases

if TYPE_CHECKING:
    from sandbox.api import LocalSandbox

ADVERSARIAL = load_cases("adversarial")
ADVERSARIAL_BY_NAME = {case.name: case for case in ADVERSARIAL}
ESCAPES = {case.name: case for case in load_cases("escape")}
HONEST = {case.name: case for case in load_cases("honest")}
# Two jobs in flight at once: the session server has two workers.
CONCURRENCY = 2
JOB_TIMEOUT_S = 240.0


def verify_case(client: SandboxClient, case: Case, **fill: str) -> VerifyResult:
    """Submit one case (placeholders filled) without timing, as a client would."""
    return client.verify(
        case.problem_source(),
        case.candidate_source(**fill),
        timing=False,
        timeout_s=JOB_TIMEOUT_S,
        **case.options,
    )


def verify_ungated(sandbox: LocalSandbox, case: Case, **fill: str) -> VerifyResult:
    """Submit one case (placeholders filled) to a sandbox without the static gate."""
    return sandbox.verify(
        case.problem_source(), case.candidate_source(**fill), timing=False, **case.options
    )


def behind_the_gate(expect: tuple[str, ...]) -> tuple[str, ...]:
    """The verdicts a case may get from the checks behind the static gate."""
    return tuple(verdict for verdict in expect if verdict != "disallowed_code")


def explain(case: Case, result: VerifyResult) -> str:
    """Everything a reader needs when a verdict is not the expected one."""
    log = result.candidate_log[-1500:] if result.candidate_log else ""
    return (
        f"{case.candidate} (tries: {case.tries})\n"
        f"  expected {' or '.join(case.expect)}, got {result.verdict}\n"
        f"  message: {result.message[:2000]}\n"
        f"  kernel launches: {result.kernel_launches}; trials: {result.trials}\n"
        f"  candidate log tail: {log}"
    )


def _selected_cases(request: pytest.FixtureRequest) -> list[Case]:
    """The parametrized adversarial cases this session will actually run."""
    wanted = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and item.module is request.module:
            case = callspec.params.get("case")
            if isinstance(case, Case):
                wanted.add(case.id)
    return [case for case in ADVERSARIAL if case.id in wanted]


@pytest.fixture(scope="module")
def submitted(
    request: pytest.FixtureRequest, sandbox_client: SandboxClient
) -> Iterator[dict[str, Future[VerifyResult]]]:
    """Every selected adversarial case, submitted up front, CONCURRENCY at a time."""
    pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="adversarial")
    futures = {
        case.id: pool.submit(verify_case, sandbox_client, case) for case in _selected_cases(request)
    }
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_manifest_matches_case_files() -> None:
    """manifest.json, the candidates' header lines and the files on disk agree."""
    assert check_manifest() == []
    assert len(ADVERSARIAL) >= 22
    assert set(ESCAPES) == {"socket_loopback", "write_tmp", "write_home", "detached_child"}


# Cheats that only Triton's CPU interpreter lets through: it runs a kernel body as
# plain Python over host memory. On a GPU the compiler rejects PyTorch calls in a
# kernel and tensors live in device memory, out of NumPy's reach (DESIGN: a CPU pass
# is necessary, not sufficient). Strict: they must start failing when fixed. The static
# gate closed the two known ones (a kernel body calling host code; NumPy and ctypes).
INTERPRETER_GAPS: set[str] = set()
# On a GPU, tensors live in device memory: reading them through raw host pointers
# (ctypes, NumPy) crashes the candidate before any answer exists. And they cross
# between grader and candidate in shared device memory, not files: there is no
# output file to sabotage, and the right answer the candidate computed stands.
GPU_VERDICTS = {
    "fallback_numpy_raw_memory": ("runtime_error",),
    "fallback_probe_memo": ("runtime_error",),
    "sabotage_output_file": ("correct",),
}
# A candidate that runs as an unprivileged user (not uid 0 with capabilities dropped)
# cannot signal the sandbox process above it: the attack fails and the right answer
# it computed stands.
UNPRIVILEGED_VERDICTS = {"kill_parent": ("correct",)}


@pytest.fixture(scope="module")
def candidate_uid(sandbox_client: SandboxClient) -> int:
    """The uid candidates run as on this server, from its isolation report."""
    for feature in sandbox_client.info().isolation:
        found = re.search(r"uid (\d+)", feature.detail)
        if feature.name == "no_privileges" and found:
            return int(found.group(1))
    return 0


def expected(case: Case, expect: tuple[str, ...], candidate_uid: int) -> tuple[str, ...]:
    """`expect`, with what a GPU or an unprivileged candidate may get instead."""
    if os.environ.get("DRTRITON_TEST_DEVICE", "cpu") == "cuda":
        expect = expect + GPU_VERDICTS.get(case.name, ())
    if candidate_uid != 0:
        expect = expect + UNPRIVILEGED_VERDICTS.get(case.name, ())
    return expect


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            case,
            marks=pytest.mark.xfail(
                os.environ.get("DRTRITON_TEST_DEVICE", "cpu") == "cpu",
                reason="CPU interpreter gap; the GPU judges",
                strict=True,
            ),
        )
        if case.name in INTERPRETER_GAPS
        else case
        for case in ADVERSARIAL
    ],
    ids=lambda case: case.name,
)
def test_adversarial_verdict(
    case: Case, submitted: dict[str, Future[VerifyResult]], candidate_uid: int
) -> None:
    """The candidate is rejected, with the verdict its header names."""
    result = submitted[case.id].result(timeout=JOB_TIMEOUT_S * 2)
    assert result.verdict in expected(case, case.expect, candidate_uid), explain(case, result)


# Cases the static gate refuses whose defence behind it is the process's limits and the
# grader's reading of what the process left: without the gate, the verdicts they had before it.
BEHIND_THE_GATE = {
    "stdout_flood": ("resource_limit",),
    "stdout_flood_ignore_sigxfsz": ("resource_limit",),
    "infinite_loop": ("timeout",),
    "os_exit": ("runtime_error",),
    "segfault_ctypes": ("runtime_error",),
    "kill_parent": ("runtime_error", "tampering"),
    "pipe_forgery": ("wrong_output", "tampering"),
    "memory_hog_numpy": ("resource_limit",),
}
SLOW_BEHIND_THE_GATE = {"memory_hog_numpy"}  # fills its memory limit: ~20 s on 2 CPU cores


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_BEHIND_THE_GATE else [])
        for name in BEHIND_THE_GATE
    ],
)
def test_adversarial_verdict_behind_the_gate(
    name: str, ungated_sandbox: LocalSandbox, candidate_uid: int
) -> None:
    case = ADVERSARIAL_BY_NAME[name]
    assert case.expect == ("disallowed_code",), "the gate lets it through: see its own test"
    result = verify_ungated(ungated_sandbox, case)
    expect = expected(case, BEHIND_THE_GATE[name], candidate_uid)
    assert result.verdict in expect, explain(case, result)


def test_failed_harness_step_names_its_reason(ungated_sandbox: LocalSandbox) -> None:
    """When a step of the harness itself fails (here the output file is gone), the
    verdict says why; the process does not just vanish with an exit status. (The static
    gate refuses the case: this is the harness behind it.)"""
    if os.environ.get("DRTRITON_TEST_DEVICE", "cpu") == "cuda":
        pytest.skip("on a GPU outputs travel in shared device memory: no file to break")
    result = verify_ungated(ungated_sandbox, ADVERSARIAL_BY_NAME["sabotage_output_file"])
    assert result.verdict == "runtime_error", explain(
        ADVERSARIAL_BY_NAME["sabotage_output_file"], result
    )
    assert "Is a directory" in result.message, result.message
    assert "exited (status" not in result.message, result.message


# -- escape attempts ----------------------------------------------------------------------


class LoopbackListener:
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections: list[tuple[str, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    data = conn.recv(4096)
                except OSError:
                    data = b""
            self.connections.append((f"{peer[0]}:{peer[1]}", data))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[LoopbackListener]:
    server = LoopbackListener()
    try:
        yield server
    finally:
        server.close()


def test_no_network_from_candidate(
    ungated_sandbox: LocalSandbox, listener: LoopbackListener
) -> None:
    """A candidate cannot reach a listener on the host's loopback."""
    case = ESCAPES["socket_loopback"]
    result = verify_ungated(ungated_sandbox, case, port=str(listener.port))
    time.sleep(0.5)  # let a late connection land before looking
    assert listener.connections == [], (
        f"the candidate connected to the host: {listener.connections}\n{explain(case, result)}"
    )
    assert result.verdict in behind_the_gate(case.expect), explain(case, result)


@pytest.mark.parametrize(
    ("name", "directory"),
    [("write_tmp", Path("/tmp")), ("write_home", Path.home())],
    ids=["tmp", "home"],
)
def test_no_file_outside_job_dir(ungated_sandbox: LocalSandbox, name: str, directory: Path) -> None:
    """A file the candidate writes outside its job directory never appears on the host."""
    case = ESCAPES[name]
    target = directory / f"drtriton-escape-{uuid.uuid4().hex}"
    try:
        result = verify_ungated(ungated_sandbox, case, path=str(target))
        assert not target.exists(), (
            f"the candidate created {target} on the host\n{explain(case, result)}"
        )
        assert result.verdict in behind_the_gate(case.expect), explain(case, result)
    finally:
        with contextlib.suppress(OSError):
            target.unlink()


def _processes_with_marker(marker: str) -> list[int]:
    """Pids on this host whose command line or environment carries `marker`."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            try:
                data = Path("/proc", entry, name).read_bytes()
            except OSError:
                continue
            if needle in data:
                found.append(int(entry))
                break
    return found


def test_no_process_outlives_job(ungated_sandbox: LocalSandbox) -> None:
    """Detached children (new session, SIGTERM ignored) die with the job."""
    case = ESCAPES["detached_child"]
    marker = f"drtriton-orphan-{uuid.uuid4().hex}"
    survivors: list[int] = []
    try:
        result = verify_ungated(ungated_sandbox, case, marker=marker)
        deadline = time.monotonic() + 10
        survivors = _processes_with_marker(marker)
        while survivors and time.monotonic() < deadline:
            time.sleep(0.25)
            survivors = _processes_with_marker(marker)
        assert survivors == [], (
            f"processes started by the candidate outlived the job: {survivors}\n"
            f"{explain(case, result)}"
        )
        assert result.verdict in behind_the_gate(case.expect), explain(case, result)
    finally:
        for pid in survivors:  # only processes carrying this test's own marker
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# -- the server survived ------------------------------------------------------------------


def test_server_survives_adversarial_suite(
    sandbox_client: SandboxClient, submitted: dict[str, Future[VerifyResult]]
) -> None:
    """After every attack the server still answers health checks and grades correctly."""
    for future in submitted.values():
        with contextlib.suppress(Exception):
            future.result(timeout=JOB_TIMEOUT_S * 2)
    assert sandbox_client.health(), "the server no longer reports SERVING"
    case = HONEST["elementwise"]
    result = verify_case(sandbox_client, case)
    assert result.verdict == "correct", explain(case, result)
