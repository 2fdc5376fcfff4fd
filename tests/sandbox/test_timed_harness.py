"""The harness's timing commands (`sandbox.timed_harness`) on the CPU, with a scripted
clock: around a stand-in harness (no jail, no guard) for the commands' own logic, and once
in a subprocess with the real instruments installed, for what the guard lets the harness
do between calls (the GPU tests run them for real in a candidate process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox import timed_harness, timed_inputs
from sandbox.timing import Clock

# What the guard's mode lets the harness do in a stretch outside the candidate's calls
# (`sandbox.guard`: allocation, views, blanking; the timing's L2 flush is a zero_).
_HARNESS_MAY = {"empty", "empty_strided", "zero_", "fill_", "detach", "alias"}


class _Stretch(TorchDispatchMode):
    """What `guard.Instruments.call` returns: the guard's rule for the harness's own work
    in a loop kept (PyTorch work between calls is refused unless run through `outside`),
    its refusals recorded in `refused`."""

    report = None

    def __init__(self) -> None:
        super().__init__()
        self.in_call = self.in_outside = False
        self.refused: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        if not (self.in_call or self.in_outside or func.is_view or name in _HARNESS_MAY):
            self.refused.append(name)
        return func(*args, **(kwargs or {}))

    def hold(self, *values: Any) -> None:
        return None

    def armed(self, fn: Any) -> Any:
        def call() -> Any:
            self.in_call = True
            try:
                return fn()
            finally:
                self.in_call = False

        return call

    def outside(self, fn: Any) -> Any:
        assert not self.in_call, "the harness's own work reached from inside a call"
        self.in_outside = True
        try:
            return fn()
        finally:
            self.in_outside = False


REPO_ROOT = Path(__file__).resolve().parents[2]


def _clock() -> Clock:
    ticks = iter(range(10_000))

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.at = 0.0

    def record(event: Event) -> None:
        event.at = float(next(ticks))

    return Clock(
        event_type=Event,
        record=record,
        elapsed=lambda start, end: end.at - start.at,
        synchronize=lambda: None,
        flush=lambda: None,
        busy=lambda: None,
        cycles_per_us=1.0,
    )


def _harness(packed: torch.Tensor, entry: Any) -> tuple[SimpleNamespace, list[dict]]:
    replies: list[dict] = []
    stretches: list[_Stretch] = []

    def call(*args: Any, **kwargs: Any) -> _Stretch:
        stretches.append(_Stretch())
        return stretches[-1]

    harness = SimpleNamespace(
        clock=_clock(),
        reply=lambda **payload: replies.append(payload),
        refused=lambda report: False,
        classify=lambda error: "runtime_error",
        _send=lambda data: None,
        _dumps=lambda value: "",
        instruments=SimpleNamespace(call=call),
        stretches=stretches,
        device="cpu",
        _inputs=lambda specs: [packed.clone()],
        _tensor=None,
        _sync=lambda: None,
        _settle=lambda: None,
        _storage_ptr=lambda t: t.untyped_storage().data_ptr(),
        entry=entry,
        seq=1,
    )
    return harness, replies


def test_each_set_reaches_the_device_only_before_its_first_call() -> None:
    """Warm-ups see only their own set in the calls' buffer; timed run i sees its own set
    and those of earlier runs, every later set still blank: no call can compute a later
    call's answer ahead of time, whatever memory it reads."""
    sets = [[torch.full((64,), float(k + 1)), torch.full((32,), float(-k - 1))] for k in range(5)]
    packed, layout = timed_inputs.pack(sets, "cpu")
    spans = timed_inputs.set_spans(layout)
    plan = timed_inputs.TimingPlan(sets=5, runs=4, warmup=2, keep=4, wanted_runs=4)
    seen: list[set[int]] = []

    def entry(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        whole = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
        present = set()
        for index, (start, length) in enumerate(spans):
            if torch.equal(whole[start : start + length], packed[start : start + length]):
                present.add(index)
            else:
                assert not whole[start : start + length].any(), "a set only in part"
        seen.append(present)
        return x * 2

    harness, replies = _harness(packed, entry)
    commands = timed_harness.timing_commands(harness)
    commands["stage"]({"inputs": [{}], "layout": layout, "spans": timed_inputs.set_spans(layout)})
    assert replies[-1] == {"ok": True}
    schedule = plan.schedule(plan.warmup + plan.runs)
    assert schedule == [4, 4, 0, 1, 2, 3]
    outputs = [{"shape": [64], "dtype": "float32"}]
    message = {"slot": "events", "wall": False, "runs": 4, "warmup": 2, "schedule": schedule}
    commands["time"]({**message, "keep": 4, "outputs": outputs})
    assert replies[-1]["ok"] and len(replies[-1]["times"]) == 4
    assert seen == [{4}, {4}, {4, 0}, {4, 0, 1}, {4, 0, 1, 2}, {4, 0, 1, 2, 3}]
    # Each run's set was brought in between calls through `outside`, which the guard's
    # mode lets pass; a copy anywhere else in the loop would be refused as PyTorch work.
    assert harness.stretches[-1].refused == []

    # The host-clock loop's sets are all there before it starts (its clock runs throughout).
    seen.clear()
    wall = {"slot": "wall", "wall": True, "runs": 3, "warmup": 0, "schedule": [0, 1, 0, 1]}
    commands["time"]({**wall, "keep": 2, "outputs": outputs})
    assert replies[-1]["ok"]
    assert all(present == {0, 1, 2, 3, 4} for present in seen)


def test_staging_again_starts_from_a_blank_buffer() -> None:
    """Sets staged a second time (a new plan) are blank again until their calls: nothing of
    the earlier staging, or of the grader's buffer, is left in the calls' memory."""
    sets = [[torch.full((16,), float(k + 1))] for k in range(3)]
    packed, layout = timed_inputs.pack(sets, "cpu")
    seen: list[float] = []

    def entry(x: torch.Tensor) -> torch.Tensor:
        whole = torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())
        seen.append(float(whole.sum()))
        return x + 1

    harness, replies = _harness(packed, entry)
    commands = timed_harness.timing_commands(harness)
    message = {"slot": "events", "wall": False, "runs": 2, "warmup": 1, "schedule": [2, 0, 1]}
    outputs = [{"shape": [16], "dtype": "float32"}]
    for _ in range(2):
        commands["stage"](
            {"inputs": [{}], "layout": layout, "spans": timed_inputs.set_spans(layout)}
        )
        commands["time"]({**message, "keep": 2, "outputs": outputs})
        assert replies[-1]["ok"]
    first, second = seen[:3], seen[3:]
    assert first == second and first[0] < first[1] < first[2]


def test_the_memory_the_sets_arrived_in_is_blank_before_any_call() -> None:
    """The sets arrive in device memory (a private copy from the grader's file, which goes
    back to PyTorch's cache, or the grader's mapping): it is blanked before any candidate
    code runs, so an allocation of the candidate's cannot find every set in it."""
    sets = [[torch.full((32,), float(k + 1))] for k in range(3)]
    packed, layout = timed_inputs.pack(sets, "cpu")
    arrived: list[torch.Tensor] = []

    def inputs(specs: list[dict]) -> list[torch.Tensor]:
        arrived.append(packed.clone())
        return [arrived[-1]]

    harness, replies = _harness(packed, lambda x: x + 1)
    harness._inputs = inputs
    timed_harness.timing_commands(harness)["stage"](
        {"inputs": [{}], "layout": layout, "spans": timed_inputs.set_spans(layout)}
    )
    assert replies[-1] == {"ok": True}
    assert packed.any() and not arrived[0].any()


# The timing commands inside a process with the real instruments installed (the CPU's
# interpreter runs the kernel; a stand-in clock): the harness's own work in a loop (the
# sets brought in between calls, the flush) must pass the guard, and a PyTorch entry
# must not. The stand-ins above cannot show the first: only the real guard refuses.
_GUARDED_LOOP = r"""
import json
from types import SimpleNamespace
import torch
import triton
import triton.language as tl
import sandbox.candidate  # noqa: F401  (imported before the guard, as in a candidate process)
from sandbox import guard, timed_harness, timed_inputs
from sandbox.timing import Clock

inst = guard.install()
replies = []

@triton.jit
def _double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

def triton_entry(x):
    out = torch.empty_like(x)
    _double[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
    return out

def torch_entry(x):
    return x * 2

flush_buffer = torch.empty(1024, dtype=torch.int32)
ticks = iter(range(10_000))

class Event:
    def __init__(self, enable_timing):
        self.at = 0.0

def record(event):
    event.at = float(next(ticks))

clock = Clock(event_type=Event, record=record, elapsed=lambda s, e: e.at - s.at,
              synchronize=lambda: None, flush=lambda: flush_buffer.zero_(), busy=lambda: None,
              cycles_per_us=1.0)

def refused(report):
    failure = report.failure()
    if failure is None:
        return False
    replies.append({"ok": False, "error_type": failure[0], "message": failure[1][-200:]})
    return True

sets = [[torch.full((100,), float(k + 1))] for k in range(4)]
packed, layout = timed_inputs.pack(sets, "cpu")
results = {}
for name, entry in [("triton", triton_entry), ("torch", torch_entry)]:
    harness = SimpleNamespace(
        clock=clock, reply=lambda **payload: replies.append(payload), refused=refused,
        classify=lambda error: "runtime_error", _send=lambda data: None, _dumps=lambda v: "",
        instruments=inst, device="cpu", _inputs=lambda specs: [packed.clone()], _tensor=None,
        _sync=lambda: None, _settle=lambda: None,
        _storage_ptr=lambda t: t.untyped_storage().data_ptr(), entry=entry, seq=1)
    commands = timed_harness.timing_commands(harness)
    commands["stage"]({"inputs": [{}], "layout": layout, "spans": timed_inputs.set_spans(layout)})
    staged = replies[-1]
    commands["time"]({"slot": "events", "wall": False, "runs": 3, "warmup": 1,
                      "schedule": [3, 0, 1, 2], "keep": 3,
                      "outputs": [{"shape": [100], "dtype": "float32"}]})
    timed = {k: v for k, v in replies[-1].items() if k != "loop_s"}
    results[name] = {"stage": staged, "time": timed}
print(json.dumps(results))
"""


def test_the_timing_commands_pass_the_real_guard(tmp_path: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _GUARDED_LOOP],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # the audit hook takes the working directory as the job's
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["triton"]["stage"] == {"ok": True}
    assert results["triton"]["time"] == {"ok": True, "times": [1.0, 1.0, 1.0]}
    refused = results["torch"]["time"]
    assert refused["ok"] is False and refused["error_type"] == "no_triton_kernel"
    assert "aten.mul" in refused["message"]
