"""The host-wide GPU gate: readers share, a timed loop is alone, a waiting writer goes first."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

from sandbox.gpu_gate import GpuGate

CONTEXT = multiprocessing.get_context("spawn")  # the test process may run threads (JAX)


def _hold(directory: str, kind: str, seconds: float, ready: Any) -> None:
    gate = GpuGate(directory)
    with gate.shared() if kind == "shared" else gate.exclusive():
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
    with gate.exclusive() as waited:
        assert waited >= 0.3  # the reader held it
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
