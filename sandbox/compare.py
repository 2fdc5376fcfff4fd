"""Output comparison: pure functions over tensors already in the grader's memory."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatch_fraction: float = 0.0
    message: str = ""
    out_of_tolerance: bool = False  # failed by finite values alone (not shape, dtype, NaN)


# Elements compared at a time: bounds the float64 temporaries for GiB-sized outputs.
CHUNK_ELEMENTS = 1 << 24
# The float32 reference's own rounding error, widened into extra absolute tolerance
# (`rounding_noise`): a kernel as accurate as PyTorch differs from PyTorch's answer by up to
# about twice PyTorch's error, and by a Gaussian tail's worth more over many elements.
NOISE_FACTOR = 4.0
NOISE_QUANTILE = 0.999
NOISE_SAMPLE = 1 << 20
# Errors above this fraction of the output's scale are not rounding: a comparison or a
# rounding op that went the other way (those must not widen the tolerance). Rounding
# itself reaches about 6e-4 of the scale: PyTorch's float32 layer_norm over a whole
# 0.9-billion-element tensor, whose statistics one GPU block accumulates.
NOISE_CAP = 1e-3


def compare_tensor(
    expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float
) -> Comparison:
    """allclose semantics, plus exact agreement on where the reference is NaN or Inf.

    Runs on the reference's device (the GPU when there is one), chunk by chunk.
    """
    if got.shape != expected.shape:
        return Comparison(False, message=f"shape {list(got.shape)} != {list(expected.shape)}")
    if got.dtype != expected.dtype:
        return Comparison(False, message=f"dtype {got.dtype} != {expected.dtype}")
    if expected.numel() == 0:
        return Comparison(True)
    device = expected.device
    flat_expected = expected.detach().reshape(-1)
    flat_got = got.detach().reshape(-1)
    nonfinite_ok = True
    max_abs = max_rel = 0.0
    mismatched = bad_finite = 0
    for start in range(0, flat_expected.numel(), CHUNK_ELEMENTS):
        exp = flat_expected[start : start + CHUNK_ELEMENTS].to(device, torch.float64)
        out = flat_got[start : start + CHUNK_ELEMENTS].to(device, torch.float64)
        finite = torch.isfinite(exp)
        infinite = torch.isinf(exp)
        nonfinite_ok = (
            nonfinite_ok
            and bool(torch.equal(torch.isnan(exp), torch.isnan(out)))
            and bool(torch.equal(exp[infinite], out[infinite]))
        )
        bad = finite & ~torch.isfinite(out)
        # Errors over the values both sides have finite; the others are counted in `bad`.
        diff = torch.where(finite & ~bad, (exp - out).abs(), 0.0)
        tolerance = torch.where(finite, atol + rtol * exp.abs(), 1e300)
        mismatched += int(((diff > tolerance) | bad).sum())
        bad_finite += int(bad.sum())
        max_abs = max(max_abs, float(diff.max()))
        if bool(finite.any()):
            rel = diff / exp.abs().clamp_min(1e-12)
            max_rel = max(max_rel, float(rel[finite].max()))
    fraction = mismatched / expected.numel()
    passed = mismatched == 0 and nonfinite_ok
    message = ""
    if bad_finite:
        message = f"{bad_finite} NaN/Inf values where the reference is finite"
    elif not nonfinite_ok:
        message = "NaN/Inf pattern differs from the reference"
    elif not passed:
        message = (
            f"{fraction:.2%} of values outside atol={atol:g} rtol={rtol:g} "
            f"(max abs error {max_abs:.3g})"
        )
    out_of_tolerance = not passed and nonfinite_ok and not bad_finite
    return Comparison(passed, max_abs, max_rel, fraction, message, out_of_tolerance)


def rounding_noise(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """Extra absolute tolerance for one output, from the reference's own float32 error.

    `approx` is the reference as the problem computes it, `exact` the same computation in
    float64 on the same inputs. A long reduction (a conv over 14k terms, a cumsum over
    thousands) misses atol = 1e-4 by rounding alone, near the zeros of its output, so an
    honest kernel that sums in another order fails against a reference no more exact
    than itself. The allowance is NOISE_FACTOR times the NOISE_QUANTILE of
    |approx - exact| over a strided sample, and 0 when that error looks like a branch taken
    differently rather than rounding (above NOISE_CAP of the output's largest magnitude),
    when the output is not floating point, or when it has no finite values.
    """
    if not approx.is_floating_point() or approx.shape != exact.shape or approx.numel() == 0:
        return 0.0
    flat_approx, flat_exact = approx.detach().reshape(-1), exact.detach().reshape(-1)
    numel = flat_exact.numel()
    count = min(numel, NOISE_SAMPLE)
    # Evenly spaced, in integers: float32 positions past 2^24 round, up to one past the end.
    step = torch.arange(count, device=flat_exact.device, dtype=torch.int64)
    index = step * (numel - 1) // max(count - 1, 1)
    sample_exact = flat_exact[index].to(torch.float64)
    sample_approx = flat_approx[index.to(flat_approx.device)].to(sample_exact.device, torch.float64)
    finite = torch.isfinite(sample_exact) & torch.isfinite(sample_approx)
    if not bool(finite.any()):
        return 0.0
    error = (sample_approx - sample_exact).abs()[finite]
    scale = float(sample_exact[finite].abs().max())
    noise = float(torch.quantile(error, NOISE_QUANTILE))
    if noise > NOISE_CAP * scale:
        return 0.0
    return NOISE_FACTOR * noise


def combine(comparisons: list[Comparison]) -> Comparison:
    """One trial's verdict over all its outputs."""
    if not comparisons:
        return Comparison(True)
    failed = [(i, c) for i, c in enumerate(comparisons) if not c.passed]
    return Comparison(
        passed=not failed,
        max_abs_error=max(c.max_abs_error for c in comparisons),
        max_rel_error=max(c.max_rel_error for c in comparisons),
        mismatch_fraction=max(c.mismatch_fraction for c in comparisons),
        message="; ".join(f"output {i}: {c.message}" for i, c in failed),
    )


def output_degeneracy(outputs: list[torch.Tensor], atol: float, rtol: float) -> list[str]:
    """Outputs a zero or constant answer would match: below the tolerance, or nearly constant.

    On the outputs' own device, without temporaries: a GiB output costs no host copy.
    """
    reasons = []
    for i, out in enumerate(outputs):
        if not out.is_floating_point() or out.numel() == 0:
            continue
        low, high = (float(v) for v in torch.aminmax(out.detach()))
        peak = max(abs(low), abs(high))
        if peak <= atol:
            reasons.append(f"output {i} is smaller than the tolerance")
        elif out.numel() > 1 and high - low <= atol + rtol * peak:
            reasons.append(f"output {i} is nearly constant")
    return reasons


def same_outputs(a: list[torch.Tensor], b: list[torch.Tensor], atol: float, rtol: float) -> bool:
    """Whether two sets of outputs agree within the tolerance (NaN matching NaN)."""
    return all(
        x.shape == y.shape and compare_tensor(x, y.to(x.dtype), atol, rtol).passed
        for x, y in zip(a, b, strict=True)
    )


def degenerate_reason(
    outputs: list[torch.Tensor],
    perturbed: Iterable[tuple[int, list[torch.Tensor]]],
    atol: float,
    rtol: float,
) -> str:
    """Why a zero or constant answer could pass this problem ('' when it cannot).

    `perturbed` yields (j, the outputs with input j redrawn), one at a time (a generator
    keeps one GiB set alive, not all). Robust-kbench's filters: constant outputs,
    outputs below the tolerance, outputs blind to an input.
    """
    reasons = output_degeneracy(outputs, atol, rtol)
    reasons += [
        f"outputs do not depend on input {j}"
        for j, outs in perturbed
        if same_outputs(outputs, outs, atol, rtol)
    ]
    return "; ".join(reasons)
