"""What a candidate run costs the grader: device reads, memory, and where its time goes.

On a GPU each read of a value back from the device is a synchronisation, and beside other
busy contexts it can wait out one of their time slices; here, on the CPU, the reads are
counted (`compare.host_values`, and any `.item()`-like op). Memory is counted by a
dispatch-mode allocator hook (`tests.sandbox.live_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sandbox import compare, device_share
from sandbox.config import SandboxConfig
from sandbox.grader import Grader, Job
from sandbox.grading import gpu, judgment
from sandbox.grading.stages import add_reported_stage
from sandbox.problem import load_problem
from sandbox.result import VerifyResult
from tests.sandbox.conftest import _KERNEL, GOOD_RELU, RELU_PROBLEM, WRONG_RELU
from tests.sandbox.live_bytes import LiveBytes

TRIALS = 5
MIB = 2**20


@pytest.fixture(scope="module")
def grader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    root = tmp_path_factory.mktemp("judging")
    grader = Grader(SandboxConfig(device="cpu", job_root=str(root)), "cpu")
    # The problem's first job checks it for degeneracy (cached): not a candidate's cost.
    assert grader.grade(Job(problem=RELU_PROBLEM, candidate=GOOD_RELU, timing=False)).correct
    yield grader
    grader.close()


def _job(candidate: str) -> Job:
    return Job(problem=RELU_PROBLEM, candidate=candidate, timing=False, trials=TRIALS)


def test_a_candidate_run_waits_for_the_device_twice(
    grader: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the command (reference checked, inputs staged) and for the judgment (inputs
    as left, every output compared): one read each, not one per check, chunk and output."""
    reads: list[int] = []
    host_values = compare.host_values

    def counted(values: Any) -> list[float]:
        reads.append(len(values))
        return host_values(values)

    monkeypatch.setattr(compare, "host_values", counted)
    with LiveBytes() as probe:
        result = grader.grade(_job(GOOD_RELU))
    assert result.correct, result.message
    # A trial: its reference's NaN count, then its judgment; the two checks' runs: one.
    assert len(reads) == 2 * TRIALS + 2
    assert probe.host_reads == 0  # nothing read back another way (`.item()`, `torch.equal`)


def test_a_runs_parts_are_accounted_inside_their_stages(grader: Grader) -> None:
    result = grader.grade(_job(GOOD_RELU))
    assert result.correct, result.message
    stages = result.stage_seconds
    parts = {"reference.draw", "run.exchange", "run.round_trip", "run.harness", "run.call"}
    assert parts | {"run.judge"} <= set(stages)
    runs = sum(stages[s] for s in ("first_trial", "trials", "noop_check"))
    assert stages["run.exchange"] + stages["run.round_trip"] + stages["run.judge"] <= runs
    assert stages["reference.draw"] <= stages["reference"]
    # As the candidate's harness reports them: inside the grader's round trip.
    assert stages["run.call"] <= stages["run.harness"] <= stages["run.round_trip"] + 1e-3


def test_a_known_problem_takes_no_share_of_the_gpu_for_its_degeneracy(
    grader: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each share may wait out other jobs' timed loops: the problem's first job (the
    fixture's) checked it, so this one's shares are its candidate's runs alone."""
    shares: list[int] = []
    shared = gpu.shared_hold

    def counted(gate: Any, result: VerifyResult) -> Any:
        shares.append(1)
        return shared(gate, result)

    monkeypatch.setattr(gpu, "shared_hold", counted)
    result = grader.grade(_job(GOOD_RELU))
    assert result.correct, result.message
    # The import (its GPU work never beside a timed loop), the trials and the no-launch call.
    assert len(shares) == TRIALS + 2


def test_seconds_the_harness_reports_count_only_when_plausible() -> None:
    result = VerifyResult(verdict="correct")
    for reported in (None, "fast", -1.0, math.nan, math.inf, 0.25, 0.5):
        add_reported_stage(result, "run.call", reported)
    assert result.stage_seconds == {"run.call": 0.75}


CACHING = (
    _KERNEL.format(value="tl.maximum(x, 0.0)")
    + '''
CALLS = []


def triton_fused_operator(tensor_0):
    """Right on its first trial (its second call: the first compiles), then that again."""
    out = torch.empty_like(tensor_0)
    n = tensor_0.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](tensor_0, out, n, BLOCK=1024)
    CALLS.append(out)
    return [CALLS[1] if len(CALLS) > 1 else out]
'''
)


def test_a_cached_answer_is_named_from_fingerprints_read_only_on_failure(
    ungated_sandbox: Any,
) -> None:
    """Behind the static gate, which refuses the module-level record of calls."""
    result = ungated_sandbox.verify(RELU_PROBLEM, CACHING, timing=False, trials=TRIALS)
    assert result.verdict == "wrong_output"
    assert result.message.startswith("trial 1:") and "cached?" in result.message


ELU_DIV = """
import torch
import torch.nn.functional as F

def get_inputs():
    return [torch.randn(256, 1024), torch.rand(256, 1024) + 0.5]

def fused_operator(a, b):
    return [F.elu(a) / b]
"""


def test_the_float64_reference_runs_without_the_float32_inputs_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rounding allowance's float64 run holds its own memory, not the float32 copies
    of the inputs as well (1 MiB each here); the inputs come back exactly as drawn."""
    monkeypatch.setattr(compare, "NOISE_SAMPLE", 1024)  # a sample too small to matter
    problem = load_problem(ELU_DIV, "functional", "cpu", str(tmp_path))
    with LiveBytes() as probe:
        inputs = problem.make_inputs(0)
        expected = problem.reference(inputs)
        held = probe.restart_peak()
        (noise,) = judgment.rounding_noise(problem, inputs, expected, 1e-4, 1e-4)
        widened = probe.peak - held
        held = probe.restart_peak()
        problem.reference_float64(inputs)  # beside the float32 inputs, for comparison
        beside = probe.peak - held
    assert noise.atol > 0
    float32_inputs = 2 * MIB
    # float64 inputs, elu's result and the output: 8 MiB, less the float32 inputs freed.
    assert widened <= 8 * MIB - float32_inputs + 64 * 1024
    assert beside >= 8 * MIB
    fresh = problem.make_inputs(0)
    assert all(
        a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(inputs, fresh, strict=True)
    )


def test_widened_in_place_restores_every_input_exactly() -> None:
    a = torch.randn(5) * 1e-40  # float32 subnormals survive the round trip
    half, index, wide = torch.randn(3).half(), torch.arange(4), torch.randn(2).double()
    values: list[Any] = [a, a, half, index, 3.0, wide]
    with judgment.widened_in_place(values):
        assert [getattr(v, "dtype", None) for v in values] == [torch.float64] * 3 + [
            torch.int64,
            None,
            torch.float64,
        ]
        assert values[0] is values[1]  # one tensor given twice stays one
        assert values[3] is index and values[5] is wide
    assert values[0] is values[1] and torch.equal(values[0], a) and values[0].dtype == a.dtype
    assert torch.equal(values[2], half) and values[2].dtype == torch.float16
    assert values[3] is index and values[4] == 3.0 and values[5] is wide


class _FakeAllocator:
    """PyTorch's CUDA allocator statistics, as far as `device_share` reads them."""

    def __init__(self) -> None:
        self.allocated = self.peak = 0

    def take(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def reset(self) -> None:
        self.peak = self.allocated


def test_the_graders_peak_counts_allocator_and_buffers_at_one_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Earlier runs added the allocator's peak to the buffers' peak, from different moments
    (kept as `grader_peak_sum`); the peak now is that of both at once."""
    fake = _FakeAllocator()
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: fake.peak)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: fake.allocated)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset)
    usage = device_share._Usage
    for name, value in (("live", 0), ("peak", 0), ("with_allocator", False), ("together", 0)):
        monkeypatch.setattr(usage, name, value)
    monkeypatch.setattr(usage, "allocated", 0)
    device_share.track_with_allocator()

    def job(steps: list[tuple[str, int]]) -> tuple[int, int, int]:
        device_share.held_bytes_peak(reset=True)
        device_share.created_bytes_peak(reset=True)
        for what, nbytes in steps:
            if what == "tensor":
                fake.take(nbytes)
            else:
                usage.add(nbytes)
        together, allocated = device_share.held_bytes_peak()
        return together, allocated + device_share.created_bytes_peak(), fake.allocated

    # The float64 reference (10) while no buffer is held; a call (6 of buffers, 3 of tensors).
    steps = [("tensor", 10), ("tensor", -10), ("buffer", 6), ("tensor", 3), ("buffer", -6)]
    assert job(steps + [("tensor", -3)]) == (10, 16, 0)
    # Held at one moment: 8 of tensors beside 6 of buffers.
    assert job([("buffer", 6), ("tensor", 8), ("buffer", -6), ("tensor", -8)]) == (14, 14, 0)


def test_a_small_cache_stays_for_the_next_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to `KEPT_CACHE_BYTES` the allocator's cache is kept; above it, given back."""
    reserved = [300 * MIB]
    emptied: list[int] = []

    def empty_cache() -> None:
        emptied.append(reserved[0])
        reserved[0] = 256 * MIB  # the flush buffer stays

    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: reserved[0])
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    gpu.release_gpu_memory()
    assert emptied == [] and gpu.KEPT_CACHE_BYTES >= 300 * MIB
    reserved[0] = gpu.KEPT_CACHE_BYTES + MIB
    gpu.release_gpu_memory()
    assert emptied == [gpu.KEPT_CACHE_BYTES + MIB]


def test_a_rejected_jobs_tensors_are_gone_before_its_memory_is_released(
    grader: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error a job ends in must not keep the job's frames, and with them its tensors
    (references, staged inputs), past the memory release: on a GPU they would stay in
    PyTorch's cache, outside every reservation, while the next job runs."""
    import weakref

    from sandbox.grading import trials

    refs: list[weakref.ref[torch.Tensor]] = []
    compare_all = judgment.compare_all

    def noted(expected: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        refs.extend(weakref.ref(t) for t in expected)
        return compare_all(expected, *args, **kwargs)

    alive_at_release: list[int] = []
    finish = Grader._finish

    def finishing(self: Grader, *args: Any) -> None:
        alive_at_release.append(sum(ref() is not None for ref in refs))
        finish(self, *args)

    monkeypatch.setattr(trials.judgment, "compare_all", noted)
    monkeypatch.setattr(Grader, "_finish", finishing)
    result = grader.grade(_job(WRONG_RELU))
    assert result.verdict == "wrong_output", result.message
    assert refs and alive_at_release == [0]


def test_an_error_raised_during_another_lets_go_of_both_frames() -> None:
    """`without_frames` follows the chain (`raise ... from None` still keeps the error
    being handled as its context), so no frame of either holds a tensor."""
    import weakref

    from sandbox.grading.job import Rejected, without_frames

    refs: list[weakref.ref[torch.Tensor]] = []

    def inner() -> None:
        staged = torch.empty(8)
        refs.append(weakref.ref(staged))
        raise RuntimeError("inner")

    def outer() -> None:
        expected = torch.empty(8)
        refs.append(weakref.ref(expected))
        try:
            inner()
        except RuntimeError:
            raise Rejected("wrong_output", "outer") from None

    try:
        outer()
    except Rejected as err:
        error = err
    assert all(ref() is not None for ref in refs)
    assert without_frames(error) is error and error.message == "outer"
    assert [ref() for ref in refs] == [None, None]
