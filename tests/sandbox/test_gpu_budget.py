"""The host-wide GPU memory budget: shared across processes, all-or-nothing, crash-safe."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from sandbox.gpu_budget import GIB, BudgetTimeout, GpuMemoryBudget, estimate_gib


def _hold(path: str, capacity: int, gib: int, seconds: float, ready: object) -> None:
    budget = GpuMemoryBudget(path, capacity)
    with budget.reserve(gib, time.monotonic() + 10):
        ready.set()  # type: ignore[attr-defined]
        time.sleep(seconds)


def _holder(path: Path, capacity: int, gib: int, seconds: float) -> multiprocessing.Process:
    context = multiprocessing.get_context("spawn")  # the test process may run threads (JAX)
    ready = context.Event()
    proc = context.Process(target=_hold, args=(str(path), capacity, gib, seconds, ready))
    proc.start()
    assert ready.wait(10), "the holder did not get its reservation"
    return proc


def test_a_reservation_waits_while_another_process_holds_the_memory(tmp_path: Path) -> None:
    path = tmp_path / "budget"
    holder = _holder(path, 3, 2, seconds=0.6)
    started = time.monotonic()
    with GpuMemoryBudget(str(path), 3).reserve(2, time.monotonic() + 10) as got:
        waited = time.monotonic() - started
    holder.join()
    assert got == 2
    assert waited >= 0.3  # it could not take 2 of 3 GiB while 2 were held


def test_what_fits_beside_a_holder_is_granted_at_once(tmp_path: Path) -> None:
    path = tmp_path / "budget"
    holder = _holder(path, 3, 2, seconds=2)
    started = time.monotonic()
    with GpuMemoryBudget(str(path), 3).reserve(1, time.monotonic() + 10):
        assert time.monotonic() - started < 0.5
    holder.terminate()
    holder.join()


def _request_later(
    path: str, capacity: int, gib: int, delay: float, granted: object, hold: float
) -> None:
    time.sleep(delay)
    with GpuMemoryBudget(path, capacity).reserve(gib, time.monotonic() + 10):
        granted.value = time.time()  # type: ignore[attr-defined]
        time.sleep(hold)


def test_a_large_reservation_is_not_starved_by_smaller_ones(tmp_path: Path) -> None:
    """A job that needs the whole budget waits for what is held; a small job arriving
    while it waits queues behind it, even though the small one would fit at once."""
    path = tmp_path / "budget"
    holder = _holder(path, 4, 2, seconds=1.0)
    context = multiprocessing.get_context("spawn")
    small_granted = context.Value("d", 0.0)
    small = context.Process(target=_request_later, args=(str(path), 4, 1, 0.3, small_granted, 0.1))
    small.start()
    with GpuMemoryBudget(str(path), 4).reserve(4, time.monotonic() + 10):
        large_granted = time.time()
        time.sleep(0.3)
    small.join(10)
    holder.join()
    assert small.exitcode == 0
    assert small_granted.value > large_granted  # 1 of 4 GiB was free all along


def test_no_memory_before_the_deadline_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "budget"
    holder = _holder(path, 2, 2, seconds=5)
    try:
        with (
            pytest.raises(BudgetTimeout, match="did not come free"),
            GpuMemoryBudget(str(path), 2).reserve(1, time.monotonic() + 0.3),
        ):
            pass
    finally:
        holder.terminate()
        holder.join()


def test_a_killed_holder_leaks_nothing(tmp_path: Path) -> None:
    path = tmp_path / "budget"
    holder = _holder(path, 2, 2, seconds=60)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    with GpuMemoryBudget(str(path), 2).reserve(2, time.monotonic() + 2) as got:
        assert got == 2


def test_requests_are_clamped_to_the_budget() -> None:
    assert estimate_gib(0) == 1
    assert estimate_gib(GIB) == 3  # the default factor
    assert estimate_gib(GIB // 3, factor=6.0) == 2
    with pytest.raises(ValueError, match="at least 1 GiB"):
        GpuMemoryBudget("/nonexistent", 0)


def test_a_request_larger_than_the_budget_runs_alone(tmp_path: Path) -> None:
    with GpuMemoryBudget(str(tmp_path / "budget"), 3).reserve(50, time.monotonic() + 2) as got:
        assert got == 3


def test_a_grader_that_cannot_get_memory_answers_sandbox_error(tmp_path: Path) -> None:
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader, Job

    problem = (
        "import torch\n\ndef get_inputs():\n    return [torch.randn(8, 8)]\n\n"
        "def fused_operator(x):\n    return [torch.relu(x)]\n"
    )
    candidate = (
        "import torch, triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x):\n"
        "    pass\n\ndef triton_fused_operator(x):\n    return [x]\n"
    )
    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    grader.gpu_budget = GpuMemoryBudget(str(tmp_path / "budget"), 2)
    holder = _holder(tmp_path / "budget", 2, 2, seconds=10)
    try:
        result = grader.grade(Job(problem=problem, candidate=candidate, budget_s=3))
    finally:
        holder.terminate()
        holder.join()
        grader.close()
    assert result.verdict == "sandbox_error"
    assert "GPU stayed full" in result.message
    assert result.stage_seconds["gpu_memory_wait"] >= 0.5


def test_a_jobs_gpu_share_is_freed_only_once_its_candidate_is_gone(tmp_path: Path) -> None:
    """The verdict does not wait for a dying candidate; the next job's memory does."""
    import contextlib

    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader

    events: list[str] = []

    class DyingCandidate:
        def close(self) -> None:
            time.sleep(0.4)  # a CUDA process takes a while to die
            events.append("reaped")

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    held = contextlib.ExitStack()
    held.callback(lambda: events.append("share freed"))
    started = time.monotonic()
    grader._retire(DyingCandidate(), held)  # type: ignore[arg-type]
    assert time.monotonic() - started < 0.2  # the grader moves on at once
    assert events == []
    grader.close()  # waits for the reaper
    assert events == ["reaped", "share freed"]


def test_a_job_reserves_its_graders_copies_and_its_candidates_cap() -> None:
    """A GiB-sized job reserves what its grader and its candidate can hold at once."""
    from sandbox.grader import candidate_gpu_bytes, job_gpu_gib
    from sandbox.timing import L2_FLUSH_BYTES

    flush = L2_FLUSH_BYTES  # the timing clock's buffer, in the candidate's allocator
    assert candidate_gpu_bytes(0) == 2 * GIB + flush  # small problems: a few temporaries
    assert candidate_gpu_bytes(8 * GIB) == 24 * GIB + flush
    assert job_gpu_gib(8 * GIB) == 16 + 24 + 1  # the flush buffer rounds up to a GiB
    assert job_gpu_gib(1024) == 3  # rounded up to whole GiB
