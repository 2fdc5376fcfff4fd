"""Output comparison: pure functions over tensors already in the grader's memory."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
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


# Elements compared at a time: bounds the temporaries for GiB-sized outputs to 28 bytes an
# element of one chunk (both sides in float64, their differences, tolerances and a few
# masks): 224 MiB, however large the output.
CHUNK_ELEMENTS = 1 << 23
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


def _blocks(shape: tuple[int, ...], limit: int) -> Iterator[tuple[int | slice, ...]]:
    """Indexes that cut a tensor of `shape` into consecutive blocks (in C order) of at most
    `limit` elements along its leading dimensions. From the shape alone: two tensors of
    one shape are cut alike, whatever their strides."""
    if not shape:
        yield ()
        return
    inner = math.prod(shape[1:])
    if inner <= limit:
        rows = max(1, limit // max(inner, 1))
        for start in range(0, shape[0], rows):
            yield (slice(start, start + rows),)
        return
    for row in range(shape[0]):
        for rest in _blocks(shape[1:], limit):
            yield (row, *rest)


def pieces(*tensors: torch.Tensor) -> Iterator[tuple[torch.Tensor, ...]]:
    """Tensors of one shape, flattened together in pieces of at most CHUNK_ELEMENTS.

    A piece of a contiguous tensor is a view; of another, a copy of that piece alone
    (`reshape(-1)` of the whole tensor would copy all of it).
    """
    for index in _blocks(tuple(tensors[0].shape), CHUNK_ELEMENTS):
        yield tuple(t.detach()[index].reshape(-1) for t in tensors)


def host_values(values: Sequence[torch.Tensor]) -> list[float]:
    """The elements of these device tensors (scalars, mostly) as floats, in one read per device.

    A read from a GPU waits for all the work queued before it, and beside other processes'
    busy contexts that wait can last one of their time slices: the grader gathers what it
    must know of a candidate's call and reads it at once.
    """
    flat = [v.detach().reshape(-1).to(torch.float64) for v in values]
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(flat):
        by_device.setdefault(v.device, []).append(i)
    read: list[list[float]] = [[] for _ in flat]
    for indices in by_device.values():
        joined = torch.cat([flat[i] for i in indices]).cpu().tolist()
        start = 0
        for i in indices:
            read[i] = joined[start : start + flat[i].numel()]
            start += flat[i].numel()
    return [x for v in read for x in v]


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether `b` differs anywhere from `a` (`not torch.equal(a, b)`: NaN differs from NaN),
    as a device scalar (read with `host_values`), chunk by chunk: no temporary the size of
    the tensors."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.ones((), dtype=torch.bool, device=a.device)
    found = torch.zeros((), dtype=torch.bool, device=a.device)
    for x, y in pieces(a, b):
        found |= (x != y.to(x.device)).any()
    return found


def nonfinite(tensor: torch.Tensor) -> torch.Tensor:
    """How many NaN and Inf values `tensor` holds, as a device scalar (`host_values`),
    counted chunk by chunk."""
    count = torch.zeros((), dtype=torch.int64, device=tensor.device)
    if tensor.is_floating_point() or tensor.is_complex():
        for (piece,) in pieces(tensor):
            count += (~torch.isfinite(piece)).sum()
    return count


@dataclass(frozen=True)
class Pending:
    """A comparison queued on the device, its figures not read back yet (`conclude`)."""

    decided: Comparison | None  # known without the device: shape, dtype, nothing to compare
    # NaN/Inf pattern differs, mismatched, bad finite, max abs error, max rel error
    figures: torch.Tensor | None
    numel: int = 0
    atol: float = 0.0
    rtol: float = 0.0


FIGURES = 5  # the length of `Pending.figures`


def measure(expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> Pending:
    """`compare_tensor`'s work, queued on the reference's device chunk by chunk; its five
    figures stay there until `conclude` reads them (with those of other comparisons)."""
    if got.shape != expected.shape:
        shapes = f"shape {list(got.shape)} != {list(expected.shape)}"
        return Pending(Comparison(False, message=shapes), None)
    if got.dtype != expected.dtype:
        return Pending(Comparison(False, message=f"dtype {got.dtype} != {expected.dtype}"), None)
    if expected.numel() == 0:
        return Pending(Comparison(True), None)
    device = expected.device
    pattern_differs = torch.zeros((), dtype=torch.bool, device=device)
    mismatched = torch.zeros((), dtype=torch.int64, device=device)
    bad_finite = torch.zeros((), dtype=torch.int64, device=device)
    max_abs = torch.zeros((), dtype=torch.float64, device=device)
    max_rel = torch.zeros((), dtype=torch.float64, device=device)
    for exp_piece, got_piece in pieces(expected, got):
        # Never changed in place: for a float64 piece on this device `to` is the piece itself.
        exp = exp_piece.to(device, torch.float64)
        out = got_piece.to(device, torch.float64)
        del exp_piece, got_piece  # copies, for a tensor that is not contiguous
        finite = torch.isfinite(exp)
        # Where the reference is NaN or Inf, the candidate must match it exactly.
        pattern_differs |= (torch.isnan(exp) != torch.isnan(out)).any()
        pattern_differs |= (torch.isinf(exp) & (exp != out)).any()
        both = torch.isfinite(out)
        bad = finite & ~both
        both &= finite
        # Errors over the values both sides have finite; the others are counted in `bad`.
        diff = torch.sub(exp, out).abs_().masked_fill_(~both, 0.0)
        del out, both
        magnitude = exp.abs()
        del exp
        tolerance = magnitude.mul(rtol).add_(atol).masked_fill_(~finite, 1e300)
        mismatched += ((diff > tolerance) | bad).sum()
        bad_finite += bad.sum()
        del tolerance, bad
        max_abs = torch.maximum(max_abs, diff.max())
        # Relative errors where the reference is finite (all >= 0, so 0 elsewhere is neutral).
        rel = torch.div(diff, magnitude.clamp_min_(1e-12), out=magnitude)
        max_rel = torch.maximum(max_rel, rel.masked_fill_(~finite, 0.0).max())
        del diff, magnitude, rel, finite  # before the next chunk's
    figures = torch.stack(
        [pattern_differs.double(), mismatched.double(), bad_finite.double(), max_abs, max_rel]
    )
    return Pending(None, figures, expected.numel(), atol, rtol)


def conclude(
    pending: Sequence[Pending], *extra: torch.Tensor
) -> tuple[list[Comparison], list[float]]:
    """The pending comparisons, and the values of `extra` device tensors, from one read."""
    figures = [p.figures for p in pending if p.figures is not None]
    values = host_values([*figures, *extra])
    rows = iter(values[FIGURES * i : FIGURES * (i + 1)] for i in range(len(figures)))
    comparisons = [p.decided if p.decided is not None else _verdict(p, next(rows)) for p in pending]
    return comparisons, values[FIGURES * len(figures) :]


def _verdict(pending: Pending, figures: list[float]) -> Comparison:
    pattern_differs, mismatched_count, bad_count, max_abs, max_rel = figures
    mismatched, bad_finite = int(mismatched_count), int(bad_count)  # exact below 2^53
    nonfinite_ok = not pattern_differs
    fraction = mismatched / pending.numel
    passed = mismatched == 0 and nonfinite_ok
    message = ""
    if bad_finite:
        message = f"{bad_finite} NaN/Inf values where the reference is finite"
    elif not nonfinite_ok:
        message = "NaN/Inf pattern differs from the reference"
    elif not passed:
        message = (
            f"{fraction:.2%} of values outside atol={pending.atol:g} rtol={pending.rtol:g} "
            f"(max abs error {max_abs:.3g})"
        )
    out_of_tolerance = not passed and nonfinite_ok and not bad_finite
    return Comparison(passed, max_abs, max_rel, fraction, message, out_of_tolerance)


def compare_tensor(
    expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float
) -> Comparison:
    """allclose semantics, plus exact agreement on where the reference is NaN or Inf.

    Runs on the reference's device (the GPU when there is one), chunk by chunk, and reads
    its figures back once.
    """
    return conclude([measure(expected, got, atol, rtol)])[0][0]


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
    numel = exact.numel()
    count = min(numel, NOISE_SAMPLE)
    # Evenly spaced, in integers: float32 positions past 2^24 round, up to one past the end.
    step = torch.arange(count, device=exact.device, dtype=torch.int64)
    index = step * (numel - 1) // max(count - 1, 1)
    # `take` indexes in C order whatever the strides: no flat copy of a whole tensor.
    sample_exact = torch.take(exact.detach(), index).to(torch.float64)
    sample_approx = torch.take(approx.detach(), index.to(approx.device))
    sample_approx = sample_approx.to(sample_exact.device, torch.float64)
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
