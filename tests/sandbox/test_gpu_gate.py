"""The host-wide GPU gate: readers share, a timed loop is alone, a waiting writer goes first."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox.gpu_gate import GpuGate

CONTEXT = multiprocessing.get_context("spawn")  # the test process may run threads (JAX)


def _hold(directory: str, kind: str, seconds: float, ready: Any) -> None:
    gate = GpuGate(directory)
    with gate.shared() if kind != "exclusive" else gate.exclusive() as hold:
        if kind == "overrun":  # a call past its lease: the gate goes, the GPU stays busy
            hold.overrun()
        ready.set()
        time.sleep(seconds)


def _holder(directory: Path, kind: str, seconds: float) -> multiprocessing.Process:
    ready = CONTEXT.Event()
    proc = CONTEXT.Process(target=_hold, args=(str(directory), kind, seconds, ready))
    proc.start()
    assert ready.wait(20), f"the {kind} holder did not get the gate"
    return proc


def _waiting_writer(directory: Path, log: Any) -> multiprocessing.Process:
    proc = CONTEXT.Process(target=_write_when_free, args=(str(directory), log))
    proc.start()
    return proc


def _write_when_free(directory: str, log: Any) -> None:
    with GpuGate(directory).exclusive():
        log.put(("writer", time.monotonic()))


def test_readers_share_the_gate(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "shared", seconds=2)
    started = time.monotonic()
    with GpuGate(str(tmp_path)).shared() as hold:
        assert time.monotonic() - started < 0.5
        assert hold.held
    holder.terminate()
    holder.join()


def test_a_timed_loop_waits_for_readers_and_readers_wait_for_it(tmp_path: Path) -> None:
    gate = GpuGate(str(tmp_path))
    reader = _holder(tmp_path, "shared", seconds=0.6)
    with gate.exclusive() as hold:
        assert hold.waited_s >= 0.3  # the reader held it
        assert hold.quiet and hold.overrun_wait_s < 0.3
    reader.join()
    writer = _holder(tmp_path, "exclusive", seconds=0.6)
    started = time.monotonic()
    with gate.shared() as hold:
        assert time.monotonic() - started >= 0.3
        assert hold.waited_s >= 0.3
    writer.join()


def test_a_waiting_writer_blocks_new_readers(tmp_path: Path) -> None:
    """Writer preference: a stream of readers cannot starve a timed loop."""
    log = CONTEXT.Queue()
    first_reader = _holder(tmp_path, "shared", seconds=0.8)
    writer = _waiting_writer(tmp_path, log)
    time.sleep(0.3)  # the writer is now queued behind the first reader
    with GpuGate(str(tmp_path)).shared():
        entered = time.monotonic()
    name, written = log.get(timeout=10)
    writer.join()
    first_reader.join()
    assert name == "writer"
    assert written < entered  # the second reader came after the waiting writer


def _write_for(directory: str, name: str, seconds: float, log: Any) -> None:
    with GpuGate(directory).exclusive():
        log.put((name, "in", time.monotonic()))
        time.sleep(seconds)
        log.put((name, "out", time.monotonic()))


def test_waiting_writers_go_one_after_another_before_new_readers(tmp_path: Path) -> None:
    """Timed loops that wait together share one drain of the readers: no reader that came
    while they waited slips in between them (each would make the next drain again)."""
    log = CONTEXT.Queue()
    first_reader = _holder(tmp_path, "shared", seconds=0.8)
    writers = []
    for name in ("a", "b", "c"):
        writers.append(CONTEXT.Process(target=_write_for, args=(str(tmp_path), name, 0.2, log)))
        writers[-1].start()
        time.sleep(0.1)
    with GpuGate(str(tmp_path)).shared():
        entered = time.monotonic()
    for writer in writers:
        writer.join()
    first_reader.join()
    events = sorted((log.get(timeout=10) for _ in range(6)), key=lambda e: e[2])
    assert [what for _, what, _ in events] == ["in", "out"] * 3  # one writer at a time
    assert events[-1][2] < entered  # all three before the reader that came meanwhile


def test_a_released_hold_lets_a_timed_loop_in_before_the_block_ends(tmp_path: Path) -> None:
    gate = GpuGate(str(tmp_path))
    log = CONTEXT.Queue()
    with gate.shared() as hold:
        writer = _waiting_writer(tmp_path, log)
        time.sleep(0.3)
        assert log.empty()  # the writer waits for this reader
        hold.release()
        assert not hold.held
        name, _ = log.get(timeout=10)
        assert name == "writer"
    writer.join()


def test_a_dead_holder_does_not_wedge_the_gate(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "exclusive", seconds=60)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    started = time.monotonic()
    with GpuGate(str(tmp_path)).exclusive():
        assert time.monotonic() - started < 1


def test_a_timed_loop_waits_for_calls_running_past_their_lease(tmp_path: Path) -> None:
    """An overrunning call gives the gate up but still runs on the GPU: timing waits."""
    overrun = _holder(tmp_path, "overrun", seconds=0.8)
    started = time.monotonic()
    with GpuGate(str(tmp_path)).exclusive(quiet_within=10) as hold:
        assert hold.waited_s < 0.3  # the gate itself was free
        assert hold.overrun_wait_s >= 0.3 and hold.quiet
        assert time.monotonic() - started < 5
    overrun.join()


def test_the_wait_for_overruns_is_bounded_and_readers_pass(tmp_path: Path) -> None:
    overrun = _holder(tmp_path, "overrun", seconds=30)
    gate = GpuGate(str(tmp_path))
    started = time.monotonic()
    with gate.shared() as hold:  # correctness work is not held up by an overrun
        assert hold.waited_s < 0.3
    with gate.exclusive(quiet_within=0.3) as timed:
        assert not timed.quiet
        assert 0.3 <= timed.overrun_wait_s < 2
    with gate.exclusive() as untimed:  # no bound given: looked at once, no wait
        assert not untimed.quiet and untimed.overrun_wait_s < 0.1
    assert time.monotonic() - started < 5
    overrun.terminate()
    overrun.join()
    with gate.exclusive(quiet_within=5) as after:  # a dead holder's mark goes with it
        assert after.quiet and after.overrun_wait_s < 1


@pytest.mark.usefixtures("cpu_candidates")
def test_a_graders_call_past_its_lease_marks_the_gpu_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grader's lease hands the gate over as an overrun, for as long as the call runs."""
    import sandbox.grader
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader, Job
    from tests.sandbox.conftest import GOOD_RELU, RELU_PROBLEM

    monkeypatch.setattr(sandbox.grader, "SHARED_LEASE_S", 0.05)
    slow = GOOD_RELU.replace(
        "def triton_fused_operator(tensor_0):\n",
        "def triton_fused_operator(tensor_0):\n    import time\n    time.sleep(0.4)\n",
    )
    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    grader.gate = GpuGate(str(tmp_path / "gate"))
    seen_busy = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with open(grader.gate.overrun_path, "ab") as overrun:
            while not done.is_set():
                try:
                    fcntl.flock(overrun, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(overrun, fcntl.LOCK_UN)
                except BlockingIOError:
                    seen_busy.set()
                time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = grader.grade(Job(problem=RELU_PROBLEM, candidate=slow, timing=False, trials=2))
    finally:
        done.set()
        watcher.join()
        grader.close()
    assert result.correct, result.message
    assert seen_busy.is_set()
    with GpuGate(str(tmp_path / "gate")).exclusive(quiet_within=1) as after:
        assert after.quiet and after.overrun_wait_s < 0.5  # every mark ended with its call


def test_the_workers_self_test_waits_for_a_timed_loop(tmp_path: Path) -> None:
    """The device self-test runs kernels: it takes a share, never runs beside a timed loop."""
    from sandbox.worker import held_self_test

    writer = _holder(tmp_path, "exclusive", 0.6)
    started = time.monotonic()
    assert held_self_test(GpuGate(str(tmp_path)), "cpu") == ""
    assert time.monotonic() - started >= 0.4
    writer.join(10)
    started = time.monotonic()  # without a gate (a CPU grader) it runs at once
    assert held_self_test(None, "cpu") == ""
    assert time.monotonic() - started < 5
