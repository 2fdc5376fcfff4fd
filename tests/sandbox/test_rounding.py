"""The reference's own float32 rounding widens the tolerance, and nothing else does.

A long reduction's float32 answer is itself off by rounding; an honest kernel that sums in
another order can miss a tight tolerance against it while being just as exact. The sandbox
measures that rounding once per problem (the reference in float64) and allows for it.
"""

from __future__ import annotations

import re

import pytest
import torch

from sandbox.client import SandboxClient
from sandbox.compare import (
    NOISE_FACTOR,
    TIE_CAP,
    TIE_FACTOR,
    TIE_SLACK,
    Allowance,
    allowance,
    compare_tensor,
    conclude,
    measure,
    rounding_noise,
)
from sandbox.problem import load_problem

ROWS, COLS, BLOCK = 16, 8192, 512
TIGHT = {"atol": 1e-9, "rtol": 1e-9}

ROW_SUM_PROBLEM = f"""
import torch

def get_inputs():
    return [torch.randn({ROWS}, {COLS})]

def fused_operator(x):
    return [torch.sum(x, dim=1)]
"""

# One program per row, summing BLOCK columns at a time: another order than PyTorch's.
ROW_SUM_KERNEL = f"""
import torch
import triton
import triton.language as tl

@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(total, axis=0) + OFFSET)

def triton_fused_operator(x):
    x = x.contiguous()
    out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
    row_sum_kernel[(x.shape[0],)](x, out, x.shape[1], OFFSET=OFFSET_VALUE, BLOCK={BLOCK})
    return [out]
"""


def _blocked_row_sum(x: torch.Tensor) -> torch.Tensor:
    """The kernel's order of summation, in PyTorch."""
    return x.view(ROWS, COLS // BLOCK, BLOCK).sum(dim=1).sum(dim=1)


def test_rounding_noise_covers_another_summation_order() -> None:
    torch.manual_seed(0)
    x = torch.randn(ROWS, COLS)
    reference, reordered = x.sum(dim=1), _blocked_row_sum(x)
    exact = x.double().sum(dim=1)
    # The premise: the two float32 answers differ by far more than a tight atol.
    assert not compare_tensor(reference, reordered, **TIGHT).passed
    noise = rounding_noise(reference, exact)
    assert 0 < noise < 1e-2
    assert compare_tensor(reference, reordered, TIGHT["atol"] + noise, TIGHT["rtol"]).passed
    # A real error stays an error.
    assert not compare_tensor(reference, reordered + 0.01, noise, TIGHT["rtol"]).passed


def test_rounding_noise_ignores_branches_taken_differently() -> None:
    exact = torch.arange(500, dtype=torch.float64).repeat(200)
    flipped = exact.float().clone()
    flipped[::500] += 1.0  # a floor or a comparison that went the other way: 0.2% of values
    assert rounding_noise(flipped, exact) == 0.0
    # Not floating point, or nothing to compare: no allowance.
    assert rounding_noise(exact.long(), exact) == 0.0
    assert rounding_noise(torch.zeros(0), torch.zeros(0, dtype=torch.float64)) == 0.0
    assert rounding_noise(torch.full((4,), float("nan")), exact[:4]) == 0.0


def test_rounding_noise_samples_large_outputs_within_bounds() -> None:
    # Past 2^24 elements float32 positions round; one rounded past the end crashed the
    # grader on a GPU (a device-side assert), a 3.6 GB cumsum first.
    numel = 2**24 + 4
    exact = torch.zeros(numel, dtype=torch.float64)
    exact[-1] = 1.0
    approx = exact.float()
    approx[-1] += 1e-6  # the last element is in the sample: the error there is seen
    assert rounding_noise(approx, exact) == 0.0  # one element in a million: not rounding
    approx += 1e-6
    assert rounding_noise(approx, exact) == pytest.approx(NOISE_FACTOR * 1e-6, rel=0.01)


def test_rounding_noise_scales_with_the_quantile() -> None:
    exact = torch.linspace(1.0, 2.0, 10_000, dtype=torch.float64)
    approx = (exact + 5e-6).float()  # float32 rounds this offset by at most 6e-8
    assert rounding_noise(approx, exact) == pytest.approx(NOISE_FACTOR * 5e-6, rel=0.05)


def test_rounding_noise_covers_a_whole_tensor_layer_norm() -> None:
    """PyTorch's float32 layer_norm over 0.9 billion elements missed float64 by 6e-4 of
    the output's scale (on an H200, against 7e-7 for the teacher's kernel): rounding,
    which must widen the tolerance rather than fail the better kernel."""
    exact = torch.linspace(-5.5, 5.5, 100_000, dtype=torch.float64)
    approx = (exact * (1 + 6e-4)).float()  # the statistics slightly off: error grows with |x|
    noise = rounding_noise(approx, exact)
    assert noise > 3e-3
    assert compare_tensor(approx, exact.float(), 1e-4 + noise, 1e-4).passed


def test_the_float64_reference_moves_to_the_host_when_the_gpu_is_full(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox.grading.judgment import rounding_noise
    from sandbox.problem import Problem

    problem = load_problem(ROW_SUM_PROBLEM, "functional", "cpu", str(tmp_path))
    inputs = problem.make_inputs(0)
    expected = problem.reference(inputs)
    original = Problem.reference_float64
    devices: list[str | None] = []

    def full_gpu(self: Problem, inputs: list, device: str | None = None) -> list:
        devices.append(device)
        if device is None:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")
        return original(self, inputs, device)

    monkeypatch.setattr(Problem, "reference_float64", full_gpu)
    (noise,) = rounding_noise(problem, inputs, expected, 1e-4, 1e-4)
    assert devices == [None, "cpu"]
    assert noise.atol > 0  # measured on the host: the row sums' rounding is allowed for

    def no_room(self: Problem, inputs: list, device: str | None = None) -> list:
        raise MemoryError if device == "cpu" else torch.cuda.OutOfMemoryError("full")

    monkeypatch.setattr(Problem, "reference_float64", no_room)
    assert rounding_noise(problem, inputs, expected, 1e-4, 1e-4) is None  # not now, not never


def test_a_few_elements_allowance_covers_other_draws() -> None:
    """The allowance is measured on one draw of inputs and serves every later one: over an
    output of 16 values it must not hang on how large that draw's few errors happened to
    be (the 0.999 quantile alone fell short on 3 draws of these 400)."""
    short = []
    for seed in range(400):
        draws = torch.Generator().manual_seed(seed)
        x = torch.randn(ROWS, COLS, generator=draws)
        noise = rounding_noise(x.sum(dim=1), x.double().sum(dim=1))
        y = torch.randn(ROWS, COLS, generator=draws)
        miss = float((_blocked_row_sum(y) - y.sum(dim=1)).abs().max())
        if miss > noise:
            short.append(seed)
    assert short == []


def test_float64_reference_uses_float64_for_tensors_the_problem_creates(tmp_path) -> None:
    source = """
import torch
import torch.nn.functional as F

def get_inputs():
    return [torch.randn(64, 6)]

def fused_operator(x):
    return [F.batch_norm(x, torch.zeros(6), torch.ones(6), training=True)]
"""
    problem = load_problem(source, "functional", "cpu", str(tmp_path))
    inputs = problem.make_inputs(0)
    (exact,) = problem.reference_float64(inputs)
    assert exact.dtype == torch.float64
    assert inputs[0].dtype == torch.float32  # the grader's inputs are left as they were
    torch.testing.assert_close(exact.float(), problem.reference(inputs)[0])


def test_float64_reference_widens_the_problems_own_float32_casts(tmp_path) -> None:
    """`argmax(...).float()` feeding a conv: float32 there would break the float64 run."""
    source = """
import torch
import torch.nn.functional as F

def get_inputs():
    return [torch.randn(5, 8, 6, 7), torch.randn(8, 4, 3, 3)]

def fused_operator(x, w):
    index = torch.argmax(x, dim=0, keepdim=True).float()
    return [F.conv_transpose2d(index, w, stride=2)]
"""
    problem = load_problem(source, "functional", "cpu", str(tmp_path))
    inputs = problem.make_inputs(0)
    (exact,) = problem.reference_float64(inputs)
    assert exact.dtype == torch.float64
    (approx,) = problem.reference(inputs)
    torch.testing.assert_close(exact.float(), approx)
    assert rounding_noise(approx, exact) > 0  # an allowance, where there was none


def test_sandbox_allows_for_the_references_rounding(sandbox_client: SandboxClient) -> None:
    honest = sandbox_client.verify(
        ROW_SUM_PROBLEM,
        ROW_SUM_KERNEL.replace("OFFSET_VALUE", "0.0"),
        timing=False,
        trials=2,
        **TIGHT,
    )
    assert honest.verdict == "correct", honest.message
    wrong = sandbox_client.verify(
        ROW_SUM_PROBLEM,
        ROW_SUM_KERNEL.replace("OFFSET_VALUE", "0.01"),
        timing=False,
        trials=2,
        **TIGHT,
    )
    assert wrong.verdict == "wrong_output"
    assert "the reference's own float32 rounding" in wrong.message


# Near-ties: each row's answer is which of its two sums is larger. In every TIE_EVERY-th
# row the second half is the first reversed, equal sums in exact arithmetic that float32
# rounds apart either way: the reference itself misses its exact answer there.
TIE_ROWS, TIE_WIDTH, TIE_EVERY, TIE_BLOCK = 1 << 17, 64, 1 << 13, 256

TIE_PROBLEM = f"""
import torch

def get_inputs():
    x = torch.randn({TIE_ROWS}, 2, {TIE_WIDTH})
    x[::{TIE_EVERY}, 1] = x[::{TIE_EVERY}, 0].flip(-1)
    return [x]

def fused_operator(x):
    return [torch.argmax(x.sum(dim=2), dim=1).float()]
"""

TIE_KERNEL = f"""
import torch
import triton
import triton.language as tl

@triton.jit
def larger_sum_kernel(x_ptr, out_ptr, rows, MARGIN: tl.constexpr, WIDTH: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    col = tl.arange(0, WIDTH)
    mask = row[:, None] < rows
    first = x_ptr + row[:, None] * (2 * WIDTH) + col[None, :]
    a = tl.sum(tl.load(first, mask=mask, other=0.0), axis=1)
    b = tl.sum(tl.load(first + WIDTH, mask=mask, other=0.0), axis=1)
    tl.store(out_ptr + row, tl.where(b > a + MARGIN, 1.0, 0.0), mask=row < rows)

def triton_fused_operator(x):
    x = x.contiguous()
    out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(x.shape[0], {TIE_BLOCK}),)
    larger_sum_kernel[grid](x, out, x.shape[0], MARGIN=MARGIN_VALUE, WIDTH={TIE_WIDTH},
                            BLOCK={TIE_BLOCK})
    return [out]
"""


def _indices_with_flips(n: int, flips: int) -> tuple[torch.Tensor, torch.Tensor]:
    exact = torch.arange(n, dtype=torch.float64) % 7
    approx = exact.float()
    approx[torch.randperm(n, generator=torch.Generator().manual_seed(0))[:flips]] += 1
    return approx, exact


def test_allowance_counts_the_references_own_near_ties() -> None:
    n = 1 << 20
    approx, exact = _indices_with_flips(n, 12)  # 1.1e-5 of the elements
    found = allowance(approx, exact, 1e-4, 1e-4)
    assert found.atol == 0.0  # twelve flips are no rounding
    assert found.misses == pytest.approx(TIE_FACTOR * 12 / n)
    assert found.allowed(n) == 4 * 12 + TIE_SLACK
    many = int(2 * TIE_CAP * n)  # more than ties: an unstable problem, no allowance
    assert allowance(*_indices_with_flips(n, many), 1e-4, 1e-4) == Allowance(0.0, 0.0)
    assert allowance(exact.float(), exact, 1e-4, 1e-4) == Allowance(0.0, 0.0)
    # A reference that rounded the exact way everywhere: the nudged inputs find the ties.
    moved, _ = _indices_with_flips(n, 12)
    assert allowance(exact.float(), exact, 1e-4, 1e-4, moved.double()).misses == found.misses
    nan = exact.float()
    nan[3] = float("nan")  # NaN where exact arithmetic has a number: not a tie
    assert allowance(nan, exact, 1e-4, 1e-4).misses == 0.0


def test_allowed_misses_pass_and_one_more_fails() -> None:
    expected = torch.arange(1000, dtype=torch.float32)
    got = expected.clone()
    got[:5] += 1
    (within,), _ = conclude([measure(expected, got, 1e-4, 1e-4, allowed=5)])
    assert within.passed and within.mismatch_fraction == pytest.approx(0.005)
    (beyond,), _ = conclude([measure(expected, got, 1e-4, 1e-4, allowed=4)])
    assert not beyond.passed
    assert "5 of 1,000 values (0.5%) outside atol=0.0001 rtol=0.0001, 4 allowed" in beyond.message
    got[7] = float("nan")  # NaN is never among the allowed misses
    (nan,), _ = conclude([measure(expected, got, 1e-4, 1e-4, allowed=50)])
    assert not nan.passed and "NaN/Inf" in nan.message


def test_sandbox_allows_the_references_near_ties(sandbox_client: SandboxClient) -> None:
    """An honest kernel breaks ties by its own rounding; a margin that misjudges one row in
    three hundred is still wrong."""
    honest = sandbox_client.verify(
        TIE_PROBLEM, TIE_KERNEL.replace("MARGIN_VALUE", "0.0"), timing=False, trials=3
    )
    assert honest.verdict == "correct", honest.message
    wrong = sandbox_client.verify(
        TIE_PROBLEM, TIE_KERNEL.replace("MARGIN_VALUE", "0.05"), timing=False, trials=3
    )
    assert wrong.verdict == "wrong_output", wrong.message
    # Counted either way: beside the allowance where the honest kernel's own flips had it
    # measured (Triton's interpreter), alone where its sums round as the reference's (a GPU).
    assert re.search(r"\d+ of 131,072 values \([\d.]+%\) outside", wrong.message), wrong.message
