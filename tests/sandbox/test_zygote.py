"""The candidate fork server: jailed forks, exit statuses, nothing left behind.

The adversarial suite judges what candidates do through the same processes; these
tests pin down the zygote's own promises on the CPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.isolation import Limits, namespaces_available
from sandbox.process import CandidateProcess, candidate_env
from sandbox.zygote import CANDIDATE_NICE, Zygote


@pytest.fixture
def zygote(tmp_path: Path, cpu_candidates: None) -> Iterator[Zygote]:
    home = tmp_path / "zygote"
    home.mkdir()
    started = Zygote("cpu", candidate_env(str(home), "cpu"))
    yield started
    started.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting to be reaped is not alive either.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_forked_candidate_is_jailed_and_answers(zygote: Zygote, tmp_path: Path) -> None:
    proc = CandidateProcess(zygote, str(tmp_path), "cpu", Limits())
    try:
        ready = proc.wait_ready(time.monotonic() + 60)
        assert ready["ready"]
        reply = proc.request(
            time.monotonic() + 30, cmd="probe", port=1, outside_path=str(tmp_path / "escaped")
        )
        # A write outside the job directory lands in a private scratch /tmp, if anywhere.
        assert not reply["connected"]
        # Compiling candidates yield to the graders (and the one being timed).
        assert os.getpriority(os.PRIO_PROCESS, proc.proc.pid) == CANDIDATE_NICE
        # The zygote's imports (torch, Triton) are frozen: the fork's collections skip them.
        assert reply["gc_frozen"] > 10_000
        if namespaces_available():
            assert ready["jail_missing"] == []
            assert reply["pid"] == 1 and not reply["capabilities"]
    finally:
        proc.close()
    assert not (tmp_path / "escaped").exists()


def test_a_ready_candidate_says_how_long_its_start_up_steps_took(
    zygote: Zygote, tmp_path: Path
) -> None:
    proc = CandidateProcess(zygote, str(tmp_path), "cpu", Limits())
    try:
        proc.wait_ready(time.monotonic() + 60)
        time.sleep(0.2)  # a spare waiting for its job
        taken = time.monotonic()
        seconds = proc.startup_seconds(taken)
    finally:
        proc.close()
    # On a CPU host there is no CUDA context, clock or Triton driver to start.
    assert list(seconds) == ["spawn", "jail", "ready", "idle"]
    assert min(seconds.values()) >= 0
    assert seconds["idle"] >= 0.2
    assert sum(seconds.values()) == pytest.approx(taken - proc.created)


def test_the_exit_status_of_a_killed_candidate_is_reported(zygote: Zygote, tmp_path: Path) -> None:
    proc = CandidateProcess(zygote, str(tmp_path), "cpu", Limits())
    try:
        proc.wait_ready(time.monotonic() + 60)
        assert proc.proc.poll() is None
        os.killpg(proc.proc.pid, signal.SIGKILL)
        code = proc.proc.wait(timeout=10)
        assert code in (-signal.SIGKILL, 128 + signal.SIGKILL)
    finally:
        proc.close()


@pytest.mark.usefixtures("cpu_candidates")
def test_closing_the_zygote_kills_what_it_started(tmp_path: Path) -> None:
    home = tmp_path / "zygote"
    home.mkdir()
    zygote = Zygote("cpu", candidate_env(str(home), "cpu"))
    proc = CandidateProcess(zygote, str(tmp_path), "cpu", Limits())
    proc.wait_ready(time.monotonic() + 60)
    pid = proc.proc.pid
    zygote.close()
    assert not zygote.alive
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    proc.close()  # nothing left to kill: returns at once


def test_the_compiler_warm_up_leaves_one_thread_to_fork(tmp_path: Path) -> None:
    """Warming Triton's compiler for a GPU (no GPU needed) must not start threads."""
    code = (
        "import os\n"
        "from sandbox.zygote import warm_compile\n"
        "warm_compile(90)\n"
        "print(len(os.listdir('/proc/self/task')))\n"
    )
    env = candidate_env(str(tmp_path), "cuda")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1"]
    # The compiled kernel went to this process's own cache, not a shared one.
    assert any((tmp_path / ".triton").rglob("*.cubin"))


@pytest.mark.usefixtures("cpu_candidates")
def test_a_grader_outlives_its_zygote(tmp_path: Path) -> None:
    """A killed zygote takes its forks along; the next job still gets a verdict on the kernel."""
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader, Job
    from tests.sandbox.conftest import GOOD_RELU, RELU_PROBLEM

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    try:
        grader.prestart()
        assert grader.zygote is not None
        grader.zygote.proc.kill()
        grader.zygote.proc.wait()
        result = grader.grade(Job(problem=RELU_PROBLEM, candidate=GOOD_RELU, timing=False))
        assert result.verdict == "correct", result.message
    finally:
        grader.close()


@pytest.mark.usefixtures("cpu_candidates")
def test_a_grader_keeps_its_spares_started_and_hands_out_the_oldest(tmp_path: Path) -> None:
    """`spares=2`: two processes on their way; a job takes the oldest live one (a dead one
    is passed over) and the next starts at once; closing the grader ends them all."""
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path), spares=2), "cpu")
    try:
        grader.prestart()
        first, second = grader.spares
        assert grader.take_process() is first
        assert len(grader.spares) == 2 and grader.spares[0] is second
        os.kill(second.proc.pid, signal.SIGKILL)
        second.proc.wait(timeout=30)
        third = grader.spares[1]
        assert grader.take_process() is third  # the dead one was passed over
        assert len(grader.spares) == 2
        kept = list(grader.spares)
    finally:
        grader.close()
    assert not grader.spares
    for proc in kept:
        assert proc.proc.wait(timeout=30) is not None
    first.close()
    third.close()


def test_a_gpu_zygote_starts_with_a_warm_compiler(tmp_path: Path) -> None:
    """The GPU flavour (compiler warmed for sm_90) starts on a host without a GPU too."""
    env = candidate_env(str(tmp_path), "cuda")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    zygote = Zygote("cuda", env, arch=90)
    try:
        assert zygote.alive
    finally:
        zygote.close()
    assert any((tmp_path / ".triton").rglob("*.cubin"))


def test_gpu_candidates_get_one_hardware_queue_cpu_candidates_the_interpreter(
    tmp_path: Path,
) -> None:
    """One connection halves the driver's context creation: the start-up ceiling."""
    gpu = candidate_env(str(tmp_path), "cuda")
    assert gpu["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "TRITON_INTERPRET" not in gpu
    cpu = candidate_env(str(tmp_path), "cpu")
    assert cpu["TRITON_INTERPRET"] == "1" and cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in cpu
