"""Timing integrity on the CPU: everything about a timed loop that needs no GPU.

The input sets and their rotation, the kept outputs and the grader's pick
(`sandbox.timed_inputs`); the harness's timing commands driven with a host clock
(`sandbox.timed_harness`: distinct sets per call, reused answers and a tampered clock
caught); the idle-GPU probe's decisions (`sandbox.grading.idle`); and what the static gate
and the instruments refuse (CUDA graphs, streams, the GPU's clocks, frames). The same
classes on a GPU, timed for real: `test_timing_integrity.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sandbox import timed_inputs
from sandbox.gate import violations
from sandbox.grading import idle
from sandbox.timed_inputs import TimingPlan, plan_timing

MIB, GIB = 2**20, 2**30
REPO_ROOT = Path(__file__).resolve().parents[2]


# -- input sets, rotation, kept outputs ----------------------------------------------------
def test_small_problems_get_a_fresh_input_set_for_every_timed_run() -> None:
    plan = plan_timing(4 * MIB, 2 * MIB, runs=50, warmup=5)
    assert plan == TimingPlan(sets=51, runs=50, warmup=5, keep=50, wanted_runs=50)
    assert plan.note == ""
    schedule = plan.schedule(55)
    assert schedule[:5] == [50] * 5  # the warm-ups' own set
    assert schedule[5:] == list(range(50))  # each timed run on a set no call used before


def test_large_inputs_rotate_over_fewer_sets_and_fewer_runs_and_say_so() -> None:
    plan = plan_timing(128 * MIB, 64 * MIB, runs=50, warmup=5)
    assert plan.sets == timed_inputs.TIMING_SETS_BYTES // (128 * MIB) == 8
    assert plan.runs == 2 * plan.fresh - 1 == 13  # 7 runs on fresh sets, 6 again
    assert plan.keep == plan.runs  # every run that counts can be picked
    assert "8 input sets for 13 timed runs" in plan.note and "not 50" in plan.note
    huge = plan_timing(3 * GIB, GIB, runs=5, warmup=1)
    assert huge.sets == 1 and "1 input set for" in huge.note
    assert plan_timing(GIB, GIB, runs=5, warmup=1).sets == 2


@pytest.mark.parametrize("out_mib", [0, 1, 16, 64, 300, 1024, 4096])
def test_most_counted_runs_are_kept_fresh_and_none_repeats_its_predecessor(out_mib: int) -> None:
    for in_mib in (1, 64, 300, 700, 2048):
        plan = plan_timing(in_mib * MIB, out_mib * MIB, runs=50, warmup=5)
        assert plan.runs <= 2 * plan.keep - 1 and plan.keep <= plan.runs
        kept = timed_inputs.kept_calls(plan.runs + plan.warmup, plan.keep)
        assert all(c >= plan.warmup for c in kept)  # only timed runs are kept, never warm-ups
        timed = plan.schedule(plan.warmup + plan.runs)[plan.warmup - 1 :]
        first_uses = len(set(timed[1:]) - {timed[0]})
        if plan.fresh:
            assert first_uses > plan.runs / 2  # most timed runs see a set for the first time
        for sets in (timed, plan.schedule(80, wall=True)):
            if plan.sets >= 2:
                assert all(a != b for a, b in zip(sets, sets[1:], strict=False))


def test_timing_memory_counts_the_extra_sets_and_kept_outputs() -> None:
    plan = plan_timing(128 * MIB, 64 * MIB, runs=50, warmup=5)
    candidate, grader = timed_inputs.extra_bytes(plan, 128 * MIB, 64 * MIB)
    assert candidate == 7 * 128 * MIB + (plan.keep - 2) * 64 * MIB
    assert grader == 2 * 7 * 128 * MIB
    assert timed_inputs.extra_bytes(plan_timing(MIB, 0, 1, 0), MIB, 0) == (MIB, 2 * MIB)  # 2 sets


def test_the_grader_draws_distinct_kept_calls_and_never_the_same_few() -> None:
    pool = timed_inputs.kept_calls(55, 50)
    assert list(pool) == list(range(5, 55))
    seen: set[int] = set()
    for _ in range(1000):
        picked = timed_inputs.picks(pool)
        assert len(picked) == len(set(picked)) == timed_inputs.TIMED_PICKS
        assert picked == sorted(picked) and set(picked) <= set(pool)
        seen |= set(picked)
    assert seen == set(pool)  # every kept call can be the one checked
    assert timed_inputs.picks(range(7, 9)) == [7, 8]


def test_sets_pack_into_one_buffer_and_come_back_as_distinct_views() -> None:
    sets = [
        [
            torch.randn(3, 5),
            torch.arange(7, dtype=torch.int64),
            torch.rand(4) > 0.5,
            2.5,
            torch.randn(5, 3).t(),  # not contiguous: packed as its values
            torch.randn(3).half(),
        ]
        for _ in range(3)
    ]
    buffer, layout = timed_inputs.pack(sets, "cpu")
    assert buffer.dtype == torch.uint8 and buffer.dim() == 1
    assert all(
        e["offset"] % timed_inputs.PACK_ALIGN == 0 for s in layout for e in s if "offset" in e
    )
    back = timed_inputs.unpack(buffer, layout)
    pointers = set()
    for original, views in zip(sets, back, strict=True):
        assert views[3] == 2.5
        for a, b in zip(original, views, strict=True):
            if isinstance(a, torch.Tensor):
                assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b)
                assert b.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
                pointers.add(b.data_ptr())
    assert len(pointers) == 3 * 5  # every tensor of every set in memory of its own


def test_outputs_of_distinct_calls_must_be_distinct_memory() -> None:
    reused = timed_inputs.reused_outputs
    assert reused([(0, [10, 20]), (1, [30]), (2, [40, 40])]) is None  # one call's views
    assert reused([(0, [10]), (1, [20]), (2, [10])]) == (0, 2)
    assert reused([(5, [10])], forbidden=[10]) == (-1, 5)  # an input's memory


# -- the harness's timing commands, driven with a host clock -------------------------------
class _HostEvent:
    def __init__(self, enable_timing: bool = True) -> None:
        self.at = 0.0


def _host_clock() -> Any:
    from sandbox.timing import Clock

    def record(event: _HostEvent) -> None:
        event.at = time.perf_counter()

    flush_buffer = torch.zeros(64, dtype=torch.int32)
    return Clock(
        event_type=_HostEvent,
        record=record,
        elapsed=lambda start, end: (end.at - start.at) * 1e3,
        synchronize=lambda: None,
        flush=lambda: flush_buffer.zero_(),
        busy=lambda: None,
        cycles_per_us=1.0,
    )


class _Instruments:
    """Stands in for `sandbox.guard.install()`: stretches that report nothing."""

    def call(self, plan: str, classify: Any, steps: bool = False) -> Any:
        from sandbox.guard import CallReport, Stretch

        return Stretch(lambda: None, lambda exc, values: CallReport(0, None, None, None), steps)


def _harness(entry: Callable[..., Any]) -> tuple[Any, dict[str, Callable[..., None]], list[Any]]:
    """A harness with a host clock and `entry` as the candidate; what it sends is collected."""
    from sandbox.timed_harness import timing_commands

    sent: list[Any] = []
    copies: list[torch.Tensor] = []  # the grader's buffers `fetch` wrote into

    def grader_buffer(spec: dict[str, Any], shared: bool) -> torch.Tensor:
        copies.append(torch.full(spec["shape"], float("nan"), dtype=getattr(torch, spec["dtype"])))
        return copies[-1]

    harness = SimpleNamespace(
        copies=copies,
        clock=_host_clock(),
        reply=lambda **payload: sent.append(payload),
        refused=lambda report: False,
        classify=lambda error: "runtime_error",
        instruments=_Instruments(),
        device="cpu",
        _inputs=lambda specs: [specs[0]["tensor"]],
        _tensor=grader_buffer,
        _sync=lambda: None,
        _settle=lambda: None,
        _storage_ptr=lambda t: t.untyped_storage().data_ptr(),
        _send=lambda raw: sent.append(json.loads(raw)),
        _dumps=json.dumps,
        seq=7,
        entry=entry,
    )
    commands = timing_commands(harness)
    sets = [[torch.full((4,), float(i))] for i in range(6)]
    buffer, layout = timed_inputs.pack(sets, "cpu")
    commands["stage"](
        {"inputs": [{"tensor": buffer}], "layout": layout, "spans": timed_inputs.set_spans(layout)}
    )
    sent.clear()
    return harness, commands, sent


def _time(commands: dict[str, Callable[..., None]], **msg: Any) -> None:
    loop = {"slot": "events", "runs": 4, "warmup": 2, "wall": False, "keep": 4}
    loop |= {"schedule": [0, 1, 2, 3, 4, 5], "outputs": [{"shape": [4], "dtype": "float32"}]}
    commands["time"]({**loop, **msg})


def test_each_call_runs_on_its_own_set_in_rotation() -> None:
    seen: list[float] = []

    def kernel(x: torch.Tensor) -> torch.Tensor:
        seen.append(float(x[0]))
        return x + 1

    _, commands, sent = _harness(kernel)
    _time(commands)
    assert sent[-1]["ok"] and len(sent[-1]["times"]) == 4
    assert seen == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    seen.clear()
    _time(commands, slot="wall", wall=True, schedule=[0, 1] * 3, runs=5, warmup=0)
    assert seen == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert sent[-2] == {"loop_done": 7}  # the host clock's loop marks its end first


def test_a_reused_answer_is_rejected_even_when_inputs_repeat() -> None:
    cache: dict[int, torch.Tensor] = {}

    def cached(x: torch.Tensor) -> torch.Tensor:  # keyed on the input's address
        return cache.setdefault(x.data_ptr(), x + 1)

    _, commands, sent = _harness(cached)
    _time(commands, schedule=[0, 1] * 3)
    assert sent[-1]["ok"] is False and sent[-1]["error_type"] == "wrong_output"
    assert "reused" in sent[-1]["message"]

    _, commands, sent = _harness(lambda x: x)  # an input handed back as the answer
    _time(commands)
    assert sent[-1]["error_type"] == "wrong_output" and "input" in sent[-1]["message"]


def test_a_clock_changed_during_the_loop_is_tampering() -> None:
    holder: list[Any] = []

    def rig(x: torch.Tensor) -> torch.Tensor:
        object.__setattr__(holder[0].clock, "elapsed", lambda start, end: 1e-6)
        return x + 1

    harness, commands, sent = _harness(rig)
    holder.append(harness)
    _time(commands)
    assert sent[-1]["error_type"] == "tampering" and "clock" in sent[-1]["message"]


def test_the_grader_keeps_its_picks_and_fetches_them_by_call() -> None:
    harness, commands, sent = _harness(lambda x: x * 2)
    _time(commands)
    commands["fetch"]({"outputs": {}, "calls": {}, "keep": {"events": [3, 5]}})
    assert sent[-1] == {"ok": True}
    outputs = {"events": [{"shape": [4], "dtype": "float32"}]}
    # Call 5 ran on set 5 (all fives): doubled, into the grader's buffer.
    commands["fetch"]({"outputs": outputs, "calls": {"events": 5}, "keep": {}})
    assert torch.equal(harness.copies[-1], torch.full((4,), 10.0))
    # Call 4 was let go: nothing is written (the grader's buffer reads NaN: judged wrong).
    written = len(harness.copies)
    commands["fetch"]({"outputs": outputs, "calls": {"events": 4}, "keep": {}})
    # A wrong dtype is not converted on the way: nothing written either.
    doubles = {"events": [{"shape": [4], "dtype": "float64"}]}
    commands["fetch"]({"outputs": doubles, "calls": {"events": 5}, "keep": {}})
    assert len(harness.copies) == written and sent[-1] == {"ok": True}


# -- the idle-GPU probe --------------------------------------------------------------------
def test_a_probe_slower_than_idle_by_the_margin_means_a_shared_gpu() -> None:
    assert idle.is_idle(10.0, 10.0) and idle.is_idle(12.4, 10.0)
    assert not idle.is_idle(12.6, 10.0) and not idle.is_idle(20.0, 10.0)
    assert idle.is_idle(50.0, 0.0)  # no calibration: no verdict against the GPU
    assert list(idle.pauses(3)) == [0.0, *idle.BUSY_PAUSES_S[:2]]


class _Probe:
    def __init__(self, readings: list[bool]) -> None:
        self.readings = readings
        self.idle_ms = 10.0

    def check(self) -> idle.ProbeReading:
        ok = self.readings.pop(0)
        return idle.ProbeReading(10.0 if ok else 30.0, ok)


def _measure(readings: list[bool]) -> tuple[Any, list[str], dict[str, float]]:
    log: list[str] = []
    notes: dict[str, float] = {}

    class Hold:
        def __enter__(self) -> None:
            log.append("hold")

        def __exit__(self, *exc: object) -> None:
            log.append("release")

    def measure() -> dict[str, float | None]:
        log.append("measure")
        return {"eager": 1.0}

    value = idle.measure_while_idle(
        _Probe(readings),  # type: ignore[arg-type]
        measure,
        hold=Hold,
        settle=lambda: log.append("settle"),
        sleep=lambda s: log.append(f"sleep {s}"),
        note=lambda name, s: notes.__setitem__(name, notes.get(name, 0.0) + s),
    )
    return value, log, notes


def test_baselines_count_only_between_two_idle_probes() -> None:
    value, log, notes = _measure([True, True])
    assert value == {"eager": 1.0} and log == ["hold", "measure", "release"]
    assert "baseline.probe" in notes and "baseline.busy" not in notes


def test_baselines_are_measured_again_when_the_gpu_was_shared() -> None:
    # Busy before the first try, busy after the second, idle around the third.
    value, log, notes = _measure([False, True, False, True, True])
    pause_1, pause_2 = (f"sleep {s}" for s in idle.BUSY_PAUSES_S[:2])
    assert log == [
        "hold", "release",
        "settle", pause_1, "hold", "measure", "release",
        "settle", pause_2, "hold", "measure", "release",
    ]  # fmt: skip
    assert value == {"eager": 1.0} and notes["baseline.busy"] >= 0


def test_a_gpu_never_idle_leaves_the_baselines_unmeasured() -> None:
    value, log, _ = _measure([False] * idle.BASELINE_ATTEMPTS)
    assert value is None and "measure" not in log


# -- the static gate -----------------------------------------------------------------------
_KERNEL = """\
import torch
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
{kernel}
    tl.store(out_ptr + offs, x, mask=offs < n)


def triton_fused_operator(x):
{host}
    out = torch.empty_like(x)
    k[(1,)](x, out, x.numel(), BLOCK=1024)
    return [out]
"""


def _refusals(kernel: str = "    pass", host: str = "    pass") -> list[str]:
    return [v.message for v in violations(_KERNEL.format(kernel=kernel, host=host))]


@pytest.mark.parametrize(
    "host",
    [
        "    g = torch.cuda.CUDAGraph()",
        "    f = torch.cuda.make_graphed_callables(triton_fused_operator, (x,))",
        "    p = torch.cuda.graphs.graph_pool_handle()",
        "    s = torch.cuda.Stream()",
        "    torch.cuda.set_stream(torch.cuda.default_stream())",
        "    e = torch.cuda.Event(enable_timing=True)",
    ],
)
def test_the_gate_refuses_graphs_streams_and_timers_in_host_code(host: str) -> None:
    found = _refusals(host=host)
    assert found and any(
        reason in m
        for m in found
        for reason in ("CUDA graphs", "one stream", "timing is the sandbox's")
    ), found


def test_the_gate_refuses_graph_capture_as_a_context() -> None:
    found = _refusals(host="    with torch.cuda.graph(torch.cuda.CUDAGraph()):\n        pass")
    assert any("context manager 'torch.cuda.graph" in m for m in found), found


@pytest.mark.parametrize(
    "asm",
    [
        '"mov.u64 $0, %globaltimer;"',
        '"mov.u32 $0, %globaltimer_lo;"',
        '"mov.u64 $0, %clock64;"',
        '"mov.u32 $0, % clock;"',
    ],
)
def test_the_gate_refuses_inline_assembly_that_reads_the_gpus_clocks(asm: str) -> None:
    call = (
        f"    t = tl.inline_asm_elementwise({asm}, '=l', [], dtype=tl.int64, is_pure=False, pack=1)"
    )
    assert any("GPU's clocks" in m for m in _refusals(kernel=call))


def test_the_gate_keeps_inline_assembly_to_literals_without_clocks() -> None:
    honest = (
        '    x = tl.inline_asm_elementwise("max.f32 $0, $1, 0f00000000;", "=r,r", [x], '
        "dtype=tl.float32, is_pure=True, pack=1)"
    )
    assert _refusals(kernel=honest) == []
    built = (
        '    x = tl.inline_asm_elementwise("mov.u64 $0, %global" + "timer;", "=l", [], '
        "dtype=tl.int64, is_pure=False, pack=1)"
    )
    assert any("string literal" in m for m in _refusals(kernel=built))
    timer = "    t = tl.extra.cuda.globaltimer()"
    assert any("GPU's clock" in m for m in _refusals(kernel=timer))


def test_the_gate_and_the_instruments_read_clock_registers_alike() -> None:
    from sandbox.gate import policy
    from sandbox.guard_hatches import TIMER_REGISTERS

    assert policy.TIMER_REGISTERS == TIMER_REGISTERS


# -- the instruments (a fresh process: installing them is for its life) -------------------
_INSTRUMENTS = r"""
import json, os, sys
import torch
import sandbox.candidate  # imported before the guard, as in a candidate process
from sandbox import guard
os.chdir(sys.argv[1])  # the job directory: its candidate.py is the candidate's code
inst = guard.install()
sys.path.insert(0, sys.argv[1])
import candidate
reports = {}
for name in candidate.ATTEMPTS:
    with inst.call("normal", lambda error: "runtime_error") as call:
        getattr(candidate, name)()
    failure = call.report.failure()
    reports[name] = None if failure is None else [failure[0], failure[1][-200:]]
with inst.call("normal", lambda error: "runtime_error") as call:
    sys._getframe(0)  # the harness's own code (not the candidate's) may
reports["harness_frame"] = call.report.failure()
print(json.dumps(reports))
"""

_CANDIDATE = """\
import sys
import traceback
import torch

ATTEMPTS = ["own_frame", "caller_frame", "walk_stack", "traceback_frame", "graph", "graphed",
            "stream", "spin", "plain"]

def own_frame():
    return sys._getframe(0).f_back.f_locals

def caller_frame():
    return sys._getframe(1)

def walk_stack():
    return list(traceback.walk_stack(None))

def traceback_frame():
    try:
        raise ValueError
    except ValueError as error:
        return error.__traceback__.tb_frame.f_back

def graph():  # (the unbound method: CPU builds cannot make a CUDAGraph at all)
    torch.cuda.CUDAGraph.capture_begin(object())

def graphed():
    torch.cuda.make_graphed_callables(plain, ())

def stream():  # (no stream object: CPU builds cannot make one)
    torch.cuda.set_stream(None)

def spin():
    torch.cuda._sleep(1000)

def plain():
    return torch.empty(3)
"""


@pytest.fixture(scope="module")
def instrument_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    job = tmp_path_factory.mktemp("job")
    (job / "candidate.py").write_text(_CANDIDATE)
    out = subprocess.run(
        [sys.executable, "-c", _INSTRUMENTS, str(job)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("attempt", ["own_frame", "caller_frame", "walk_stack", "traceback_frame"])
def test_the_candidate_cannot_read_frames_that_lead_to_the_harness(
    instrument_reports: dict[str, Any], attempt: str
) -> None:
    report = instrument_reports[attempt]
    assert report is not None and report[0] == "tampering" and "frames" in report[1], report


@pytest.mark.parametrize("attempt", ["graph", "graphed", "stream", "spin"])
def test_graphs_streams_and_spins_are_refused_at_runtime(
    instrument_reports: dict[str, Any], attempt: str
) -> None:
    report = instrument_reports[attempt]
    assert report is not None and report[0] == "tampering", report


def test_code_outside_the_candidates_may_read_frames(instrument_reports: dict[str, Any]) -> None:
    assert instrument_reports["plain"] is None
    assert instrument_reports["harness_frame"] is None


def test_a_method_added_to_a_sandbox_class_is_tampering() -> None:
    from sandbox.guard_integrity import Baseline, sandbox_classes

    labels = {label for label, _ in sandbox_classes()}
    assert {"sandbox.timing.Clock", "sandbox.guard.Stretch"} <= labels
    baseline = Baseline()
    from sandbox.timing import Clock

    Clock.sneaky = property(lambda self: None)  # type: ignore[attr-defined]
    try:
        assert baseline.rebound() == "changed the sandbox's class sandbox.timing.Clock"
    finally:
        del Clock.sneaky  # type: ignore[attr-defined]
    assert baseline.rebound() is None


def test_each_set_spans_its_own_tensors_and_nothing_of_another() -> None:
    """The harness copies a set onto the device by its span (`set_spans`): a span must
    cover every byte of its set's tensors and none of another set's, or a call would see
    its inputs only in part, or a later set early."""
    sets = [
        [torch.ones(3, 5), 2.0, torch.ones(7, dtype=torch.int64)],
        [torch.full((3, 5), 2.0), 2.0, torch.full((7,), 2, dtype=torch.int64)],
        [4.0],  # no tensors
        [torch.full((1,), 3.0, dtype=torch.float16)],
    ]
    buffer, layout = timed_inputs.pack(sets, "cpu")
    spans = timed_inputs.set_spans(layout)
    assert spans[2] == (0, 0)
    placed = [span for span in spans if span[1]]
    for (start, length), (next_start, _) in zip(placed, placed[1:], strict=False):
        assert start + length <= next_start
    # A blank buffer filled span by span holds exactly what the grader packed.
    blank = torch.zeros_like(buffer)
    for index, (start, length) in enumerate(spans):
        blank[start : start + length] = buffer[start : start + length]
        got = timed_inputs.unpack(blank, [layout[index]])[0]
        for value, want in zip(got, sets[index], strict=True):
            if isinstance(want, torch.Tensor):
                assert torch.equal(value, want)
            else:
                assert value == want
    # And a set filled alone leaves every other set's bytes blank.
    alone = torch.zeros_like(buffer)
    start, length = spans[1]
    alone[start : start + length] = buffer[start : start + length]
    first = timed_inputs.unpack(alone, [layout[0]])[0]
    assert not first[0].any() and not first[2].any()
