"""The host-wide GPU memory budget: shared across processes, all-or-nothing, crash-safe; what a
job reserves, and what a job that met a full GPU does.

Other processes hold reservations until the test lets them go (a pipe), and note in an
append-only log when they got one or had to wait: the tests wait on those states, never on
time. A reservation asked with its deadline now is one look: it says whether the memory is
free at that moment.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sandbox.gpu_budget import GIB, BudgetTimeout, GpuMemoryBudget, estimate_gib
from sandbox.grading import gpu

CONTEXT = multiprocessing.get_context("spawn")  # the test process may run threads (JAX)
STATE_TIMEOUT_S = 120.0  # only a broken budget (or a stalled machine) runs into this


def _note(log: str, name: str, event: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps([name, event]) + "\n").encode())
    finally:
        os.close(fd)


def _reserve(path: str, capacity: int, gib: int, name: str, log: str, go: Any) -> None:
    """Reserve `gib` GiB (noting `waits` at its first wait, `in` once it has them), hold
    them until `go` says (None: let go at once), note `out`."""
    import sandbox.gpu_budget as budget_module

    waited = []

    def sleep(seconds: float) -> None:
        if not waited:
            waited.append(True)
            _note(log, name, "waits")
        time.sleep(seconds)

    budget_module.time = SimpleNamespace(monotonic=time.monotonic, sleep=sleep)  # type: ignore[assignment]
    with GpuMemoryBudget(path, capacity).reserve(gib, time.monotonic() + STATE_TIMEOUT_S):
        _note(log, name, "in")
        if go is not None:
            go.poll(STATE_TIMEOUT_S * 5)  # a byte, or the test's end closing the pipe
        _note(log, name, "out")


class Holders:
    """Processes that reserve from one budget file and log what happened (`_reserve`)."""

    def __init__(self, directory: Path, capacity: int) -> None:
        self.path = str(directory / "budget")
        self.capacity = capacity
        self.log = str(directory / "events.jsonl")
        self.procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self.go: dict[str, Any] = {}

    def start(self, name: str, gib: int, hold: bool = True) -> None:
        go, send_go = CONTEXT.Pipe(duplex=False) if hold else (None, None)
        proc = CONTEXT.Process(
            target=_reserve, args=(self.path, self.capacity, gib, name, self.log, go)
        )
        proc.start()
        self.procs[name] = proc
        if go is not None:
            go.close()
            self.go[name] = send_go

    def events(self) -> list[tuple[str, str]]:
        if not os.path.exists(self.log):
            return []
        return [tuple(json.loads(line)) for line in Path(self.log).read_text().splitlines()]

    def wait_for(self, *states: tuple[str, str]) -> None:
        """Until any of `states` (name, event) is logged."""
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while not any(state in self.events() for state in states):
            assert time.monotonic() < deadline, f"gave up waiting for {states}"
            time.sleep(0.01)

    def release(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self.go[name].send_bytes(b"go")

    def join(self) -> None:
        for name, proc in self.procs.items():
            proc.join(STATE_TIMEOUT_S)
            assert proc.exitcode == 0, f"{name} ended with {proc.exitcode}"

    def close(self) -> None:
        for go in self.go.values():
            go.close()
        for proc in self.procs.values():
            proc.join(STATE_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[Holders]:
    team = Holders(tmp_path, capacity=4)
    try:
        yield team
    finally:
        team.close()


def free_now(path: str, capacity: int, gib: int) -> bool:
    """Whether `gib` GiB are free at this moment (one look)."""
    try:
        with GpuMemoryBudget(path, capacity).reserve(gib, time.monotonic()):
            return True
    except BudgetTimeout:
        return False


def test_a_reservation_waits_while_another_process_holds_the_memory(holders: Holders) -> None:
    holders.start("holder", 3)
    holders.wait_for(("holder", "in"))
    assert not free_now(holders.path, 4, 2)  # 3 of 4 GiB are held
    assert free_now(holders.path, 4, 1)  # what fits beside the holder is granted at once
    holders.release("holder")
    with GpuMemoryBudget(holders.path, 4).reserve(2, time.monotonic() + STATE_TIMEOUT_S) as got:
        assert got == 2
    holders.join()


def test_a_large_reservation_is_not_starved_by_smaller_ones(holders: Holders) -> None:
    """A job that needs the whole budget waits for what is held; a small job arriving
    while it waits queues behind it, even though the small one would fit at once."""
    holders.start("holder", 2)
    holders.wait_for(("holder", "in"))
    holders.start("large", 4, hold=False)
    holders.wait_for(("large", "waits"))
    holders.start("small", 1, hold=False)  # 2 of 4 GiB are free all along
    holders.wait_for(("small", "waits"), ("small", "in"))
    holders.release("holder")
    holders.join()
    events = holders.events()
    assert events.index(("large", "in")) < events.index(("small", "in"))


def test_no_memory_before_the_deadline_is_an_error(holders: Holders) -> None:
    holders.start("holder", 4)
    holders.wait_for(("holder", "in"))
    deadline = time.monotonic() + 0.3
    with (
        pytest.raises(BudgetTimeout, match="did not come free"),
        GpuMemoryBudget(holders.path, 4).reserve(1, deadline),
    ):
        pass
    assert time.monotonic() >= deadline


def test_a_killed_holder_leaks_nothing(holders: Holders) -> None:
    holders.start("holder", 4)
    holders.wait_for(("holder", "in"))
    pid = holders.procs["holder"].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    holders.procs["holder"].join()
    assert free_now(holders.path, 4, 4)


def test_one_process_reservations_take_their_own_bytes_and_free_only_those(
    holders: Holders,
) -> None:
    """A grader holds the last job's share (until its candidate is dead) beside the next
    job's. POSIX locks are the process's: a byte locked twice is one lock, and closing any
    descriptor of the file dropped all of them, the next job's reservation with the last."""
    budget = GpuMemoryBudget(holders.path, 4)
    with contextlib.ExitStack() as last_job:
        assert last_job.enter_context(budget.reserve(2, time.monotonic())) == 2
        with budget.reserve(2, time.monotonic()):  # the next job: the other two GiB
            assert not free_now(holders.path, 4, 1)  # not even in this process
            last_job.close()  # the reaper frees the last job's share...
            holders.start("other grader", 3, hold=False)
            holders.wait_for(("other grader", "waits"), ("other grader", "in"))  # ...only that
            assert ("other grader", "in") not in holders.events()
    holders.join()  # both gone: the other grader got its 3 GiB
    assert ("other grader", "in") in holders.events()


def test_requests_are_clamped_to_the_budget(tmp_path: Path) -> None:
    assert estimate_gib(0) == 1
    assert estimate_gib(GIB) == 3  # the default factor
    assert estimate_gib(GIB // 3, factor=6.0) == 2
    with pytest.raises(ValueError, match="at least 1 GiB"):
        GpuMemoryBudget("/nonexistent", 0)
    with GpuMemoryBudget(str(tmp_path / "budget"), 3).reserve(50, time.monotonic()) as got:
        assert got == 3  # larger than the budget: it runs alone


_PROBLEM = (
    "import torch\n\ndef get_inputs():\n    return [torch.randn(8, 8)]\n\n"
    "def fused_operator(x):\n    return [torch.relu(x)]\n"
)
_PROBLEM_IO = 2 * 8 * 8 * 4  # one 8x8 float32 input, one output
_CANDIDATE = (
    "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
    "def k(x):\n    pass\n\n\ndef triton_fused_operator(x):\n    return [x]\n"
)


def test_a_grader_that_cannot_get_memory_answers_sandbox_error(
    tmp_path: Path, holders: Holders
) -> None:
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader, Job

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    grader.gpu_budget = GpuMemoryBudget(holders.path, 4)
    holders.start("holder", 4)
    holders.wait_for(("holder", "in"))
    try:
        result = grader.grade(Job(problem=_PROBLEM, candidate=_CANDIDATE, budget_s=3))
    finally:
        grader.close()
    assert result.verdict == "sandbox_error"
    assert "GPU stayed full" in result.message
    assert result.stage_seconds["gpu_memory_wait"] > 0
    assert "gpu_retry" not in result.stage_seconds  # a full budget is not an out-of-memory


def test_a_jobs_gpu_share_is_freed_only_once_its_candidate_is_gone(tmp_path: Path) -> None:
    """The verdict does not wait for a dying candidate; the next job's memory does."""
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader

    events: list[str] = []
    dead = threading.Event()

    class DyingCandidate:
        def close(self) -> None:
            dead.wait(STATE_TIMEOUT_S)  # a CUDA process takes a while to die
            events.append("reaped")

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    held = contextlib.ExitStack()
    held.callback(lambda: events.append("share freed"))
    grader._retire(DyingCandidate(), held)  # type: ignore[arg-type]
    assert events == []  # the grader moved on while its candidate still dies
    dead.set()
    grader.close()  # waits for the reaper
    assert events == ["reaped", "share freed"]


# -- what a job reserves --------------------------------------------------------------------


def test_a_job_reserves_its_graders_copies_and_its_candidates_cap() -> None:
    """A GiB-sized job reserves what its grader and its candidate can hold at once."""
    from sandbox.grading.gpu import candidate_gpu_bytes, job_gpu_gib
    from sandbox.timing import L2_FLUSH_BYTES

    flush = L2_FLUSH_BYTES  # the timing clock's buffer, in the candidate's allocator
    assert candidate_gpu_bytes(0) == 2 * GIB + flush  # small problems: a few temporaries
    assert candidate_gpu_bytes(8 * GIB) == 24 * GIB + flush
    assert job_gpu_gib(8 * GIB) == 16 + 24 + 1  # the flush buffer rounds up to a GiB
    assert job_gpu_gib(1024) == 3  # rounded up to whole GiB


@pytest.mark.parametrize("io_gib", [0, 0.001, 1, 8, 40])
def test_a_job_that_compiles_the_baseline_reserves_that_stage_too(io_gib: float) -> None:
    """torch.compile's first call (Inductor's buffers and autotuning) comes before the
    candidate takes any memory: the reservation holds the larger of the two stages."""
    io = int(io_gib * GIB)
    plain = gpu.job_gpu_gib(io)
    compiling = gpu.job_gpu_gib(io, compiles_baseline=True)
    assert compiling >= plain
    assert compiling * GIB >= 2 * io + gpu.baseline_compile_bytes(io)
    assert gpu.baseline_compile_bytes(io) >= gpu.BASELINE_COMPILE_FIXED_BYTES + 2 * io


class FakeBudget:
    """A budget that records each reservation and how many others were live then."""

    capacity_gib = 64

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []  # (GiB, reservations live when asked)
        self.live = 0

    @contextlib.contextmanager
    def reserve(self, gib: int, deadline: float) -> Iterator[int]:
        self.asked.append((gib, self.live))
        self.live += 1
        try:
            yield gib
        finally:
            self.live -= 1


class FakeProcess:
    """A candidate process that takes a while to die (its share is freed after)."""

    def __init__(self, dying: threading.Event | None = None) -> None:
        self.dying = dying
        self.proc = SimpleNamespace(poll=lambda: None, pid=0)

    def log_tail(self) -> str:
        return ""

    def stop(self) -> None:
        pass

    def close(self) -> None:
        if self.dying is not None:
            self.dying.wait(STATE_TIMEOUT_S)


@pytest.fixture
def faked_grader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A CPU grader with a fake budget and fake candidate processes; its checks are set by
    the test (`grader.checks`: one callable a try, raising what that try meets)."""
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    grader.gpu_budget = FakeBudget()  # type: ignore[assignment]
    grader.checks = []  # type: ignore[attr-defined]
    grader.dying = threading.Event()  # type: ignore[attr-defined]
    grader.dying.set()  # type: ignore[attr-defined]
    monkeypatch.setattr(grader, "take_process", lambda: FakeProcess(grader.dying))

    def checks(ctx: Any, proc: Any) -> None:
        grader.checks.pop(0)(ctx)  # type: ignore[attr-defined]
        ctx.result.message = "correct on 1 trials"

    monkeypatch.setattr(grader, "_checks", checks)
    try:
        yield grader
    finally:
        grader.dying.set()  # type: ignore[attr-defined]
        grader.close()


def _grade(grader: Any) -> Any:
    from sandbox.grader import Job

    return grader.grade(Job(problem=_PROBLEM, candidate=_CANDIDATE, timing=False, trials=1))


def _grader_oom(ctx: Any) -> None:
    error = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    error.add_note("in the grader's compile stage")
    raise error


def _passes(ctx: Any) -> None:
    pass


def test_a_job_that_ran_out_of_gpu_memory_runs_again_alone(faked_grader: Any) -> None:
    """The first try's share is freed (its candidate dead) before the whole budget is
    asked; the second try's verdict is the job's."""
    faked_grader.checks = [_grader_oom, _passes]
    faked_grader.dying.clear()  # the first candidate dies once the grader waits for it
    wait_for_reapers = faked_grader._wait_for_reapers

    def waiting() -> None:
        faked_grader.dying.set()
        wait_for_reapers()

    faked_grader._wait_for_reapers = waiting
    result = _grade(faked_grader)
    assert result.verdict == "correct", result.message
    job_gib = gpu.job_gpu_gib(_PROBLEM_IO)
    assert faked_grader.gpu_budget.asked == [(job_gib, 0), (FakeBudget.capacity_gib, 0)]
    assert "gpu_retry" in result.stage_seconds
    assert "compile stage" in result.message  # what the first try met, for the operator


def test_a_job_retries_alone_once_only(faked_grader: Any) -> None:
    faked_grader.checks = [_grader_oom, _grader_oom]
    result = _grade(faked_grader)
    assert result.verdict == "sandbox_error"
    assert "ran out of memory" in result.message
    assert len(faked_grader.gpu_budget.asked) == 2


def test_a_candidates_own_failure_is_not_retried(faked_grader: Any) -> None:
    from sandbox.grading.job import Rejected

    def wrong(ctx: Any) -> None:
        raise Rejected("wrong_output", "trial 0: off")

    faked_grader.checks = [wrong]
    result = _grade(faked_grader)
    assert result.verdict == "wrong_output"
    assert len(faked_grader.gpu_budget.asked) == 1


def test_without_a_budget_an_out_of_memory_error_is_answered_at_once(faked_grader: Any) -> None:
    faked_grader.gpu_budget = None
    faked_grader.checks = [_grader_oom]
    result = _grade(faked_grader)
    assert result.verdict == "sandbox_error"
    assert "compile stage" in result.message


def _claims_gpu_full(asked: str) -> Any:
    def claim(ctx: Any) -> None:
        raise gpu.CandidateOutOfMemory(
            f"CUDA out of memory. Tried to allocate {asked}. GPU 0 has a total capacity..."
        )

    return claim


@pytest.mark.parametrize(
    ("asked", "free", "verdict", "tries"),
    [
        ("500.00 GiB", 100 * GIB, "resource_limit", 1),  # past its cap: its own fault
        ("1.00 GiB", 100 * GIB, "resource_limit", 1),  # the GPU had room: its cap did it
        ("1.00 GiB", 0, "sandbox_error", 2),  # the GPU was short: the host's, run alone
    ],
)
def test_a_candidates_gpu_full_claim_is_confirmed_from_outside(
    faked_grader: Any,
    monkeypatch: pytest.MonkeyPatch,
    asked: str,
    free: int,
    verdict: str,
    tries: int,
) -> None:
    monkeypatch.setattr(gpu, "free_gpu_bytes", lambda: free)
    faked_grader.checks = [_claims_gpu_full(asked), _claims_gpu_full(asked)]
    result = _grade(faked_grader)
    assert result.verdict == verdict, result.message
    assert len(faked_grader.gpu_budget.asked) == tries


def test_the_gpu_full_verdict_trusts_only_what_the_grader_knows() -> None:
    cap = gpu.candidate_gpu_bytes(GIB)  # 3 GiB and the flush buffer
    oom = "CUDA out of memory. Tried to allocate {}. GPU 0 has a total capacity of 79 GiB"
    assert gpu.requested_bytes(oom.format("1.50 GiB")) == int(1.5 * GIB)
    assert gpu.requested_bytes(oom.format("20.00 MiB")) == 20 * 2**20
    assert gpu.requested_bytes("MemoryError") is None
    assert gpu.gpu_full_verdict(oom.format("4.00 GiB"), cap, 0)[0] == "resource_limit"
    assert gpu.gpu_full_verdict(oom.format("2.00 GiB"), cap, 3 * GIB)[0] == "resource_limit"
    short = gpu.gpu_full_verdict(oom.format("2.00 GiB"), cap, GIB)
    assert short[0] == "sandbox_error" and "1.00 GiB free" in short[1]
    assert gpu.gpu_full_verdict("out of memory", cap, 0)[0] == "tampering"  # no size
    assert gpu.gpu_full_verdict(oom.format("1.00 GiB"), cap, None)[0] == "tampering"  # no GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_free_gpu_memory_is_measured_here() -> None:
    free = gpu.free_gpu_bytes()
    assert free is not None and 0 < free <= torch.cuda.get_device_properties(0).total_memory


def _compile_peak_extra(fn: Any, inputs: list[torch.Tensor]) -> int:
    """GPU memory above the inputs at torch.compile's first call, device-wide (any process
    and library), sampled in a thread while it runs."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    base, top, done = total - free, [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            free_now, _ = torch.cuda.mem_get_info()
            top[0] = max(top[0], total - free_now)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with torch.no_grad():
            torch.compile(fn)(*inputs)
        torch.cuda.synchronize()
    finally:
        done.set()
        sampler.join()
    return top[0] - base


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_torch_compiles_first_call_fits_the_baseline_allowance() -> None:
    """A sample of a paper-size problem: what torch.compile took stays in its share."""
    torch._dynamo.reset()
    x = torch.randn(8192, 16384, device="cuda")
    w = torch.randn(16384, device="cuda")

    def reference(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        y = torch.nn.functional.layer_norm(x, (16384,), w) * torch.sigmoid(x)
        return [torch.softmax(y, dim=-1), y.sum(0)]

    io = 2 * x.nbytes + w.nbytes + 16384 * 4
    assert _compile_peak_extra(reference, [x, w]) <= gpu.baseline_compile_bytes(io)
