"""Unit tests of the sandbox's pure parts: comparison, static checks, request validation."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from sandbox.api import build_request
from sandbox.compare import combine, compare_tensor, degenerate_reason
from sandbox.config import SandboxConfig
from sandbox.errors import InvalidRequestError
from sandbox.problem import ProblemError, detect_format, load_problem
from sandbox.process import REPO_ROOT
from sandbox.result import TrialOutcome, VerifyResult
from sandbox.runner import job_from_request
from sandbox.static_checks import static_verdict

GOOD = """
import torch, triton
import triton.language as tl

@triton.jit
def k(x):
    pass

def triton_fused_operator(x):
    return [x]
"""


def test_compare_accepts_within_tolerance_and_reports_errors() -> None:
    ref = torch.linspace(-1, 1, 100)
    assert compare_tensor(ref, ref + 5e-5, atol=1e-4, rtol=1e-4).passed
    bad = ref.clone()
    bad[3] += 1.0
    result = compare_tensor(ref, bad, atol=1e-4, rtol=1e-4)
    assert not result.passed
    assert math.isclose(result.max_abs_error, 1.0, rel_tol=1e-5)
    assert result.mismatch_fraction == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("got", "reason"),
    [
        (torch.zeros(4, 5), "shape"),
        (torch.zeros(4, 4, dtype=torch.float64), "dtype"),
        (torch.full((4, 4), float("nan")), "NaN"),
    ],
)
def test_compare_rejects_shape_dtype_and_nan(got: torch.Tensor, reason: str) -> None:
    result = compare_tensor(torch.zeros(4, 4), got, atol=1e-4, rtol=1e-4)
    assert not result.passed
    assert reason in result.message


def test_compare_requires_matching_nonfinite_pattern() -> None:
    ref = torch.tensor([1.0, float("inf"), float("nan")])
    assert compare_tensor(ref, ref.clone(), 1e-4, 1e-4).passed
    assert not compare_tensor(
        ref, torch.tensor([1.0, -float("inf"), float("nan")]), 1e-4, 1e-4
    ).passed
    assert not compare_tensor(ref, torch.tensor([1.0, float("inf"), 0.0]), 1e-4, 1e-4).passed


def test_compare_in_chunks_matches_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(0)
    ref = torch.randn(10, 13, generator=generator)
    ref[2, 3], ref[7, 1] = float("inf"), float("nan")
    got = ref + 1e-5 * torch.randn(10, 13, generator=generator)
    got[5, 5] += 0.5
    got[9, 0] = float("nan")
    whole = compare_tensor(ref, got, 1e-4, 1e-4)
    monkeypatch.setattr("sandbox.compare.CHUNK_ELEMENTS", 7)
    chunked = compare_tensor(ref, got, 1e-4, 1e-4)
    assert chunked == whole
    assert not whole.passed
    assert whole.mismatch_fraction == pytest.approx(2 / 130)
    assert whole.message.startswith("1 NaN/Inf values")


def test_combine_names_the_failing_output() -> None:
    ok = compare_tensor(torch.ones(2), torch.ones(2), 1e-4, 1e-4)
    bad = compare_tensor(torch.ones(2), torch.zeros(2), 1e-4, 1e-4)
    combined = combine([ok, bad])
    assert not combined.passed
    assert combined.message.startswith("output 1:")


def test_degenerate_problems_are_flagged() -> None:
    x = torch.randn(8, 8)
    assert degenerate_reason([x], [(0, [torch.randn(8, 8)])], 1e-4, 1e-4) == ""
    assert "constant" in degenerate_reason([torch.full((8, 8), 3.0)], [], 1e-4, 1e-4)
    assert "smaller than the tolerance" in degenerate_reason([x * 1e-7], [], 1e-4, 1e-4)
    assert "do not depend on input 2" in degenerate_reason([x], [(2, [x.clone()])], 1e-4, 1e-4)


@pytest.mark.parametrize(
    ("source", "verdict"),
    [
        ("def triton_fused_operator(:\n", "syntax_error"),
        (GOOD.replace("triton_fused_operator", "other_name"), "no_entry_point"),
        (GOOD.replace("@triton.jit", ""), "no_triton_kernel"),
    ],
)
def test_static_checks(source: str, verdict: str) -> None:
    found = static_verdict(source, "functional")
    assert found is not None and found[0] == verdict


def test_static_checks_pass_a_plausible_candidate() -> None:
    assert static_verdict(GOOD, "functional") is None
    assert static_verdict(GOOD, "kernelbench")[0] == "no_entry_point"


def test_detect_format() -> None:
    assert detect_format("def get_inputs(): pass\ndef fused_operator(x): pass\n") == "functional"
    assert detect_format("class Model: pass\ndef get_inputs(): pass\n") == "kernelbench"
    with pytest.raises(ProblemError):
        detect_format("x = 1\n")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"problem": ""}, "problem source is empty"),
        ({"candidate": "  "}, "candidate source is empty"),
        ({"trials": 1000}, "trials"),
        ({"atol": -1.0}, "atol"),
        ({"rtol": float("nan")}, "rtol"),
        ({"request_id": "r" * 10_000}, "request_id"),
    ],
)
def test_malformed_requests_are_rejected(kwargs: dict, fragment: str) -> None:
    args = {"problem": "p", "candidate": "c", **kwargs}
    request = build_request(args.pop("problem"), args.pop("candidate"), **args)
    with pytest.raises(InvalidRequestError, match=fragment):
        job_from_request(request, SandboxConfig(), None)


def test_client_deadline_bounds_the_job_budget() -> None:
    request = build_request("p", "c", time_budget_s=100)
    assert job_from_request(request, SandboxConfig(), timeout_s=10)["budget_s"] < 10
    assert job_from_request(request, SandboxConfig(), timeout_s=None)["budget_s"] == 100


def test_result_round_trips_through_the_wire_message() -> None:
    result = VerifyResult(
        verdict="wrong_output",
        message="trial 0: bad",
        request_id="r1",
        trials=[TrialOutcome(index=0, passed=False, max_abs_error=2.0, message="bad")],
        eager_ms=1.5,
        provenance={"device": "cpu", "interpreter": True},
        stage_seconds={"queue": 0.25, "first_trial": 1.5},
    )
    wire = result.to_proto()
    assert wire.verdict == pb.WRONG_OUTPUT
    back = VerifyResult.from_proto(wire)
    assert back.verdict == "wrong_output"
    assert back.trials[0].max_abs_error == 2.0
    assert back.eager_ms == 1.5
    assert back.candidate_ms is None  # unset optional fields stay None
    assert back.provenance["device"] == "cpu"
    assert back.stage_seconds == {"queue": 0.25, "first_trial": 1.5}


def _with_guard(code: str) -> str:
    """What `code` prints in a fresh process with the candidate's instruments installed
    (`inst`), as a candidate process has them (the guard is per process)."""
    setup = (
        "import sys, torch; from sandbox import guard; inst = guard.install()\n"
        "why = lambda error: 'runtime_error'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", setup + code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )
    return done.stdout.strip()


def test_the_guard_does_not_import_dynamo() -> None:
    # Entering the guard's dispatch mode must stay cheap: Dynamo's import costs over a
    # second of CPU in every candidate process.
    code = (
        "with inst.call('normal', why):\n"
        "    torch.ones(3) + 1\n"
        "print('torch._dynamo' in sys.modules)"
    )
    assert _with_guard(code) == "False"


def test_pytorch_compute_is_refused_on_every_call() -> None:
    """Whatever the call (trial, no-launch, compile pass), a compute op does not run: its
    result is NaN and the call is reported; allocation and constant fills stay as asked."""
    code = (
        "for plan in ('normal', 'noop', 'compile'):\n"
        "    with inst.call(plan, why) as call:\n"
        "        z = torch.zeros(3); s = torch.ones(3) + 1; t = torch.full((2,), 7.0)\n"
        "    print(plan, z.tolist(), bool(s.isnan().all()), t.tolist(), call.report.failure())"
    )
    lines = _with_guard(code).splitlines()
    refused = "('no_triton_kernel', 'PyTorch computed aten.add outside a Triton kernel, and no "
    for plan, line in zip(("normal", "noop", "compile"), lines, strict=True):
        assert line.startswith(f"{plan} [0.0, 0.0, 0.0] True [7.0, 7.0] {refused}"), line


def test_noop_calls_get_nan_for_fresh_memory() -> None:
    # On a GPU, PyTorch's caching allocator gives `torch.empty` the block the previous
    # call's output freed: with launches skipped, a nearly constant answer would survive.
    code = (
        "with inst.call('noop', why) as call:\n"
        "    f = torch.empty(5); i = torch.empty_like(f, dtype=torch.int32)\n"
        "    v = f.new_empty((2, 3)); z = torch.zeros(3)\n"
        "print(bool(f.isnan().all()), bool(v.isnan().all()), bool((i == -123456789).all()),\n"
        "      z.tolist(), call.report.failure())"
    )
    assert _with_guard(code) == "True True True [0.0, 0.0, 0.0] None"


def test_every_dtype_is_poisoned_within_its_range() -> None:
    # An int8 or int16 result once raised (the int32 sentinel overflows them): the poison
    # check failed with the candidate's runtime error instead of judging it. Floats are
    # written as NaN's bits through an integer view (`guard_ops._NAN_BITS`).
    dtypes = (
        "float16, bfloat16, float32, float64, complex64, bool, uint8, int8, int16, int32, int64"
    )
    code = (
        "with inst.call('noop', why):\n"
        f"    made = [torch.empty(4, dtype=getattr(torch, d)) for d in '{dtypes}'.split(', ')]\n"
        "print(sorted({str(t.flatten()[0].item()) for t in made}))\n"
        "print(all(bool(t.isnan().all()) for t in made if t.is_floating_point()))"
    )
    values, floats_nan = _with_guard(code).splitlines()
    assert set(eval(values)) == {  # noqa: S307 - our own subprocess's output
        "nan", "(nan+0j)", "True", "201", "-128", "-32768", "-123456789"
    }  # fmt: skip
    assert floats_nan == "True"


RELU_PROBLEM = """
import torch

def get_inputs():
    return [torch.randn(8, 8)]

def fused_operator(x):
    return [torch.relu(x)]
"""


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4 GiB"), "GPU memory"),
        (KeyError("surprise"), "grader error: KeyError"),
    ],
)
@pytest.mark.usefixtures("cpu_candidates")
def test_grader_failures_are_sandbox_errors_not_verdicts_on_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, fragment: str
) -> None:
    from sandbox.grader import Grader, Job

    def broken(*args: object) -> None:
        raise error

    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    monkeypatch.setattr(grader, "_judge", broken)
    try:
        result = grader.grade(Job(problem=RELU_PROBLEM, candidate=GOOD, timing=False))
    finally:
        grader.close()
    assert result.verdict == "sandbox_error" and result.infrastructure_failure
    assert fragment in result.message


def test_io_bytes_come_from_shapes_alone(tmp_path: Path) -> None:
    source = RELU_PROBLEM.replace("torch.randn(8, 8)", "torch.randn(1024, 1), torch.randn(1, 512)")
    source = source.replace("def fused_operator(x):", "def fused_operator(x, y):")
    source = source.replace("torch.relu(x)", "torch.relu(x + y)")
    problem = load_problem(source, "functional", "cpu", str(tmp_path))
    # The broadcast output (1024 x 512) dominates its small inputs.
    assert problem.io_bytes() == (1024 + 512 + 1024 * 512) * 4


TRITON_REFERENCE = """
import torch
import triton
import triton.language as tl

LAUNCHES = []


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


def get_inputs():
    return [torch.randn(64, 32)]


def fused_operator(x):
    out = torch.empty_like(x)
    LAUNCHES.append(x.device.type)
    copy_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    return [out]
"""


def test_a_reference_with_triton_kernels_is_never_run_on_meta_tensors(tmp_path: Path) -> None:
    """On a GPU such a launch reads address 0 and kills the grader's CUDA context."""
    problem = load_problem(TRITON_REFERENCE, "functional", "cpu", str(tmp_path))
    assert problem.io_bytes() == 64 * 32 * 4  # the inputs: outputs unknown without a run
    assert problem.module.LAUNCHES == []


def test_an_oom_under_the_cap_on_a_full_gpu_is_not_the_kernels_fault() -> None:
    """A request that fits the candidate's cap but not the device: others filled the GPU."""
    from sandbox.candidate import oom_from_full_gpu

    gib = 2**30
    oom = "CUDA out of memory. Tried to allocate 3.99 GiB. GPU 0 has a total capacity of 139.80 GiB"
    assert oom_from_full_gpu(oom, held=2 * gib, free=gib, cap=12 * gib)
    # Past its own cap: the kernel's doing, whatever the device has free.
    assert not oom_from_full_gpu(oom, held=10 * gib, free=gib, cap=12 * gib)
    # The device had room: the cap refused it.
    assert not oom_from_full_gpu(oom, held=2 * gib, free=50 * gib, cap=12 * gib)
    assert not oom_from_full_gpu("MemoryError", held=0, free=0, cap=12 * gib)


def test_shared_buffer_usage_peaks_and_resets() -> None:
    """What a grader's shared buffers held at most: outside PyTorch's allocator statistics."""
    from sandbox.device_share import _Usage, created_bytes_peak

    created_bytes_peak(reset=True)
    before = _Usage.live
    _Usage.add(3 * 2**20)
    _Usage.add(-(3 * 2**20))
    _Usage.add(2**20)
    assert created_bytes_peak() == before + 3 * 2**20
    assert created_bytes_peak(reset=True) == before + 3 * 2**20
    assert created_bytes_peak() == before + 2**20  # the peak restarts from what is held
    _Usage.add(-(2**20))


def test_gpu_memory_figures_cross_the_wire() -> None:
    from sandbox.result import VerifyResult

    result = VerifyResult(verdict="correct", gpu_memory_gib={"io": 8.0, "grader_peak": 21.5})
    assert VerifyResult.from_proto(result.to_proto()).gpu_memory_gib == result.gpu_memory_gib


def test_a_few_stray_infinities_do_not_make_a_problem_ill_posed() -> None:
    """A GPU's normal sampler draws an exact 0.0 about once in 2^24: a GiB `div` has a few
    Infs in every draw, which the candidate must match; more than that is ill-posed."""
    from sandbox.grading.job import Rejected
    from sandbox.grading.judgment import NONFINITE_LIMIT, check_reference

    answer = torch.ones(4_000_000)
    answer[[7, 123_456]] = torch.tensor([float("inf"), float("-inf")])
    assert NONFINITE_LIMIT * answer.numel() >= 2
    check_reference([answer])  # accepted
    answer[::1000] = float("nan")
    with pytest.raises(Rejected) as rejected:
        check_reference([answer])
    assert rejected.value.verdict == "bad_problem" and "4002 of 4000000" in rejected.value.message
    with pytest.raises(Rejected):
        check_reference([torch.full((8,), float("nan"))])


def test_a_stray_zero_in_a_broadcast_divisor_is_one_row_of_infinities() -> None:
    """An exact 0.0 in a [rows, 1] divisor makes a whole row of Infs: still a draw, not
    an ill-posed problem; two rows' worth more than that is."""
    from sandbox.grading.job import Rejected
    from sandbox.grading.judgment import NONFINITE_LIMIT, STRAY_DRAWS, check_reference

    numerator, divisor = torch.randn(4_000, 1_000), torch.randn(4_000, 1)
    divisor[17] = 0.0
    answer = numerator / divisor
    assert int((~answer.isfinite()).sum()) == 1_000 > NONFINITE_LIMIT * answer.numel()
    check_reference([answer], [numerator, divisor])  # accepted
    divisor[: STRAY_DRAWS + 1] = 0.0
    with pytest.raises(Rejected, match="bad_problem|NaN or Inf"):
        check_reference([numerator / divisor], [numerator, divisor])
    # Not for a scalar input: a zero there would be an all-Inf answer.
    with pytest.raises(Rejected):
        check_reference([numerator / 0.0], [numerator, torch.zeros(())])


def test_a_request_asks_at_most_the_servers_job_timeout() -> None:
    """A huge budget would overflow the wait for the worker's reply (and no request should
    hold a worker longer than the server allows)."""
    request = build_request("p", "c", time_budget_s=3e6)
    assert job_from_request(request, SandboxConfig(job_timeout_s=30), None)["budget_s"] == 30


def test_a_seed_near_the_top_of_the_range_is_refused() -> None:
    request = build_request("p", "c")
    request.options.seed = 2**64 - 1
    with pytest.raises(InvalidRequestError, match="seed"):
        job_from_request(request, SandboxConfig(), None)


class _ScriptedConn:
    """A worker's end of the pipe that answers with a canned reply."""

    def __init__(self, reply: object) -> None:
        self.reply, self.sent = reply, []

    def send(self, message: object) -> None:
        self.sent.append(message)

    def poll(self, timeout: float) -> bool:
        assert timeout < 2**31 / 1000, "poll takes at most 2**31 ms"
        return True

    def recv(self) -> object:
        return self.reply


@pytest.mark.parametrize(
    ("reply", "in_step"),
    [
        ({"result": {}, "seq": 1}, True),
        ({"result": {}, "seq": 0}, False),  # an earlier job's answer
        ({"result": {}}, False),
        (["not", "a", "dict"], False),
    ],
)
def test_a_worker_reply_out_of_step_is_the_workers_loss(reply: object, in_step: bool) -> None:
    """Each reply echoes its job's number: a worker that answers an earlier job is
    replaced, so no request gets another's verdict."""
    from sandbox.errors import SandboxInfrastructureError
    from sandbox.runner import _Worker

    worker = object.__new__(_Worker)
    worker.conn, worker._seq = _ScriptedConn(reply), 0
    job = {"budget_s": 1e9, "request_id": "r"}
    if in_step:
        assert worker.grade(job) == reply
    else:
        with pytest.raises(SandboxInfrastructureError, match="out of step"):
            worker.grade(job)
