"""Compiling before a job takes its share of the GPU, and giving the share up when slow.

The compile pass needs a GPU to compile for real (the interpreter compiles nothing);
here the launch and tuner wrappers run against stand-ins for Triton's objects, so
what they do in each mode is pinned on the CPU. The GPU suites run the real thing.
"""

from __future__ import annotations

import json
import threading
import time
from multiprocessing import Pipe
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox import guard
from sandbox.process import CandidateDied, CandidateProcess


class FakeKernel:
    def __init__(self) -> None:
        self.loaded = False

    def _init_handles(self) -> None:
        self.loaded = True


class FakeJit:
    """Stands for `JITFunction`: `run(..., warmup=True)` compiles, otherwise launches."""

    def __init__(self, fail: bool = False) -> None:
        self.kernel = FakeKernel()
        self.calls: list[bool] = []
        self.fail = fail

    def run(self, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        self.calls.append(warmup)
        if self.fail:
            raise RuntimeError("CompilationError: bad kernel")
        return self.kernel


@pytest.fixture
def state() -> Any:
    return guard._State()


@pytest.fixture
def launcher(state: Any) -> Any:
    def refuse(kind: str, what: str, raising: bool = True) -> None:
        raise AssertionError(what)

    return guard._launcher(
        lambda self, *a, **k: FakeJit.run(self, *a, **k), [FakeJit], state, refuse
    )


def test_a_compile_launch_compiles_and_loads_but_runs_nothing(launcher: Any, state: Any) -> None:
    fn = FakeJit()
    state.plan = "compile"
    assert launcher(fn, 1, grid=(1,), warmup=False) is None
    assert fn.calls == [True]  # compiled through Triton's warm-up path only
    assert fn.kernel.loaded  # module and launcher loaded ahead of the trials
    assert state.launches == 1  # an attempt: a call that launches nothing is told apart
    state.plan, state.launches = "normal", 0
    launcher(fn, 1, grid=(1,), warmup=False)
    assert fn.calls == [True, False] and state.launches == 1


def test_a_no_launch_call_returns_what_a_launch_returns_and_runs_nothing(
    launcher: Any, state: Any
) -> None:
    fn = FakeJit()
    state.plan = "noop"
    assert launcher(fn, 1, grid=(1,), warmup=False) is fn.kernel  # as a real launch returns
    assert fn.calls == [True] and state.launches == 1


def test_a_kernel_that_fails_to_compile_is_left_for_the_first_trial(
    launcher: Any, state: Any
) -> None:
    fn = FakeJit(fail=True)
    state.plan = "compile"
    assert launcher(fn, 1, grid=(1,), warmup=False) is None
    state.plan = "normal"
    with pytest.raises(RuntimeError, match="CompilationError"):
        launcher(fn, 1, grid=(1,), warmup=False)


def test_an_autotuned_kernel_compiles_every_config_and_tunes_nothing(state: Any) -> None:
    compiled: list[dict[str, Any]] = []
    tuned: list[str] = []

    class Config:
        def __init__(self, block: int) -> None:
            self.block = block

        def all_kwargs(self) -> dict[str, Any]:
            return {"BLOCK": self.block}

    class FakeTuner:
        arg_names = ["x", "n"]
        cache: dict[Any, Any] = {}
        nargs: Any = None
        fn = SimpleNamespace(run=lambda *a, **k: compiled.append(k))

        def prune_configs(self, kwargs: dict[str, Any]) -> list[Config]:
            assert self.nargs == {"x": "X", "n": 7}  # pruning sees the arguments
            return [Config(64), Config(128)]

    run = guard._wrap_autotuner(lambda self, *a, **k: tuned.append("benchmarked"), False, state)
    tuner = FakeTuner()
    state.plan = "compile"
    assert run(tuner, "X", 7, grid=(1,), warmup=False) is None
    assert [k["BLOCK"] for k in compiled] == [64, 128]
    assert tuned == [] and tuner.cache == {} and tuner.nargs is None
    state.plan = "normal"
    run(tuner, "X", 7, grid=(1,), warmup=False)
    assert tuned == ["benchmarked"]


def _bare_process() -> tuple[CandidateProcess, Any]:
    proc = CandidateProcess.__new__(CandidateProcess)
    proc.conn, child = Pipe(duplex=True)
    proc.launchers = None
    proc.launcher_requests = 0
    proc.sequence = 0
    proc.proc = SimpleNamespace(poll=lambda: None)
    return proc, child


def _run_reply(seq: int) -> dict[str, Any]:
    """What the harness answers a `run` command that asked for no outputs."""
    seconds = {"call_s": 0.01, "inputs_s": 0.0, "outputs_s": 0.0, "harness_s": 0.02}
    return {"ok": True, "seq": seq, "launches": 1, "count": 0, "outputs": [], **seconds}


def _answer_after(child: Any, seconds: float, forged: int = 0) -> threading.Thread:
    """Reply like the harness (echoing `seq`), after `forged` replies of the candidate's own."""

    def answer() -> None:
        seq = child.recv()["seq"]
        for _ in range(forged):
            child.send_bytes(json.dumps({**_run_reply(seq + 1), "launches": 7}).encode())
        time.sleep(seconds)
        child.send_bytes(json.dumps(_run_reply(seq)).encode())

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


@pytest.mark.parametrize(("reply_after", "expired"), [(0.0, 0), (0.5, 1)])
def test_a_slow_reply_ends_the_lease_once_and_still_arrives(
    reply_after: float, expired: int
) -> None:
    proc, child = _bare_process()
    ends: list[float] = []
    thread = _answer_after(child, reply_after)
    reply = proc.request(
        time.monotonic() + 10, lease=(0.2, lambda: ends.append(time.monotonic())), cmd="run"
    )
    thread.join()
    assert reply == _run_reply(1)
    assert len(ends) == expired


def test_replies_forged_on_the_pipe_are_dropped() -> None:
    """Each command is answered by its own reply, not by what the candidate wrote first."""
    proc, child = _bare_process()
    thread = _answer_after(child, 0.0, forged=3)
    reply = proc.request(time.monotonic() + 10, cmd="run")
    thread.join()
    assert reply == _run_reply(1)


def test_a_flood_of_forged_replies_is_tampering() -> None:
    proc, child = _bare_process()
    proc.stop = lambda: None  # type: ignore[method-assign]
    thread = _answer_after(child, 0.0, forged=100)
    with pytest.raises(CandidateDied) as died:
        proc.request(time.monotonic() + 10, cmd="run")
    thread.join()
    assert died.value.verdict == "tampering"


# -- through a real sandbox (CPU: the pass runs the host code; nothing compiles) ----------

PROBLEM = """
import torch

def get_inputs():
    return [torch.randn(33, 17), 3]

def fused_operator(x, k):
    return [torch.relu(x) * k]
"""

KERNEL = """
import torch
import triton
import triton.language as tl

CALLS = []


@triton.jit
def _relu_scale(x_ptr, out_ptr, n, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) * k, mask=mask)


def triton_fused_operator(x, k):
    CALLS.append((tuple(x.shape), x.dtype, x.device.type, k))
    @@CHECK@@
    out = torch.empty_like(x)
    _relu_scale[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), k, BLOCK=256)
    return [out]
"""


def _kernel(check: str) -> str:
    return KERNEL.replace("@@CHECK@@", check)


# The candidates below keep a record of their calls at module level, which the static gate
# refuses (state across calls): they run behind it (`SandboxConfig.static_gate`).


def test_the_first_call_sees_the_trials_shapes_and_is_timed_as_compile(
    ungated_sandbox: Any,
) -> None:
    same = "assert CALLS[0] == CALLS[-1], CALLS"
    result = ungated_sandbox.verify(PROBLEM, _kernel(same), timing=False)
    assert result.verdict == "correct", result.message
    assert "compile" in result.stage_seconds
    # The candidate process's own start-up, step by step (parts of no job stage: dotted).
    assert {"process.spawn", "process.jail", "process.ready", "process.idle"} <= set(
        result.stage_seconds
    )


def test_what_a_candidate_does_wrong_on_its_first_call_is_judged(ungated_sandbox: Any) -> None:
    """A candidate cannot misbehave once, unseen, while its kernels compile."""
    crash_once = "if len(CALLS) == 1: raise RuntimeError('first call')"
    result = ungated_sandbox.verify(PROBLEM, _kernel(crash_once), timing=False)
    assert result.verdict == "runtime_error"
    assert "first call" in result.message
    assert result.trials == []  # rejected before any trial ran


def test_autotuning_in_a_candidate_runs_on_a_short_budget() -> None:
    """Autotuners ask the driver for a benchmarker: the harness hands them a shorter one."""
    from sandbox.candidate import AUTOTUNE_REP_MS, AUTOTUNE_WARMUP_MS, _shorten_autotuning

    driver = SimpleNamespace(get_benchmarker=lambda: "triton's own")
    _shorten_autotuning(driver)
    bench = driver.get_benchmarker()
    assert bench.func.__name__ == "do_bench"
    assert bench.keywords == {"warmup": AUTOTUNE_WARMUP_MS, "rep": AUTOTUNE_REP_MS}
    assert AUTOTUNE_WARMUP_MS + AUTOTUNE_REP_MS < 100  # eight configs fit in a 1 s lease
