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
# Below this many finite elements the quantile is their largest error, a noisy measure of
# the error's scale (a 16-value row sum allowed too little on about one draw in 400), so
# it is at least NOISE_RMS_FACTOR times their root mean square (none short in 2,000).
# Larger outputs keep the quantile alone: it ignores a stray element where the RMS would not.
NOISE_FEW = 1000
NOISE_RMS_FACTOR = 3.0
NOISE_SAMPLE = 1 << 20
# Errors above this fraction of the output's scale are not rounding: a comparison or a
# rounding op that went the other way (those must not widen the tolerance). Rounding
# itself reaches about 6e-4 of the scale: PyTorch's float32 layer_norm over a whole
# 0.9-billion-element tensor, whose statistics one GPU block accumulates.
NOISE_CAP = 1e-3
# Near-ties: an argmax over a million rows of computed values, or a rounding op, goes the
# other way wherever two candidates for the answer differ by less than float32's rounding.
# An honest kernel that rounds differently from PyTorch misses PyTorch's answer at some of
# them. The sandbox counts the elements that are ties at float32's precision: where the
# float32 reference misses the exact (float64) answer, or where the exact answer changes
# when the inputs move by TIE_NUDGE of themselves, a few float32 rounding steps. A
# candidate may miss on TIE_FACTOR times that fraction, plus TIE_SLACK elements, when the
# fraction is at most TIE_CAP: more is not ties but an unstable problem.
TIE_FACTOR = 4.0
TIE_SLACK = 2
TIE_CAP = 1e-4
TIE_NUDGE = 2.0**-22
# Elements counted at a time for the reference's own misses: it runs beside the float64
# reference and its widened inputs, so its temporaries (about 26 bytes an element) stay
# below a MiB or two.
TIE_PIECE = 1 << 16


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


def pieces(*tensors: torch.Tensor, limit: int | None = None) -> Iterator[tuple[torch.Tensor, ...]]:
    """Tensors of one shape, flattened together in pieces of at most `limit` elements
    (CHUNK_ELEMENTS by default).

    A piece of a contiguous tensor is a view; of another, a copy of that piece alone
    (`reshape(-1)` of the whole tensor would copy all of it).
    """
    for index in _blocks(tuple(tensors[0].shape), limit or CHUNK_ELEMENTS):
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
    allowed: int = 0  # elements that may miss the tolerance (near-ties, `Allowance`)


FIGURES = 5  # the length of `Pending.figures`


def measure(
    expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float, allowed: int = 0
) -> Pending:
    """`compare_tensor`'s work, queued on the reference's device chunk by chunk; its five
    figures stay there until `conclude` reads them (with those of other comparisons).
    `allowed` elements may miss the tolerance (not NaN or Inf where the reference is finite)."""
    if got.shape != expected.shape:
        shapes = f"shape {list(got.shape)} != {list(expected.shape)}"
        return Pending(Comparison(False, message=shapes), None)
    if got.dtype != expected.dtype:
        return Pending(Comparison(False, message=f"dtype {got.dtype} != {expected.dtype}"), None)
    if expected.numel() == 0:
        return Pending(Comparison(True), None)
    return Pending(None, _figures(expected, got, atol, rtol), expected.numel(), atol, rtol, allowed)


def _figures(expected: torch.Tensor, got: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """The five figures of `Pending`, queued on `expected`'s device."""
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
    return torch.stack(
        [pattern_differs.double(), mismatched.double(), bad_finite.double(), max_abs, max_rel]
    )


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
    passed = (mismatched == 0 or mismatched <= pending.allowed and not bad_finite) and nonfinite_ok
    message = ""
    if bad_finite:
        message = f"{bad_finite} NaN/Inf values where the reference is finite"
    elif not nonfinite_ok:
        message = "NaN/Inf pattern differs from the reference"
    elif not passed:
        allowed = f", {pending.allowed:,} allowed" if pending.allowed else ""
        message = (
            f"{mismatched:,} of {pending.numel:,} values ({_percent(fraction)}) outside "
            f"atol={pending.atol:g} rtol={pending.rtol:g}{allowed} (max abs error {max_abs:.3g})"
        )
    out_of_tolerance = not passed and nonfinite_ok and not bad_finite
    return Comparison(passed, max_abs, max_rel, fraction, message, out_of_tolerance)


def _percent(fraction: float) -> str:
    """A fraction as a percentage with two significant figures below 1% (0.00017%)."""
    return f"{fraction:.2%}" if fraction >= 0.01 or fraction == 0 else f"{fraction * 100:.2g}%"


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
    |approx - exact| over a strided sample (over fewer than NOISE_FEW values, at least
    NOISE_RMS_FACTOR times their root mean square), and 0 when that error looks like a
    branch taken
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
    if error.numel() < NOISE_FEW:
        noise = max(noise, NOISE_RMS_FACTOR * float(error.square().mean().sqrt()))
    if noise > NOISE_CAP * scale:
        return 0.0
    return NOISE_FACTOR * noise


@dataclass(frozen=True)
class Allowance:
    """What the float32 reference's own error lets a candidate miss it by, for one output."""

    atol: float = 0.0  # extra absolute tolerance: the reference's rounding
    misses: float = 0.0  # fraction of elements that may miss: near-ties it broke its own way

    def allowed(self, numel: int) -> int:
        """Elements of an output of `numel` that may miss the tolerance."""
        return math.ceil(self.misses * numel) + TIE_SLACK if self.misses else 0


def allowance(
    approx: torch.Tensor,
    exact: torch.Tensor,
    atol: float,
    rtol: float,
    moved: torch.Tensor | None = None,
) -> Allowance:
    """The reference's allowance for one output, from `approx` (the reference as the problem
    computes it), `exact` (the same in float64 on the same inputs) and, to find near-ties
    the float32 reference happened to round the exact way, `moved` (in float64, on the
    inputs `nudged`).

    The rounding allowance (`rounding_noise`) widens atol; the elements that still miss
    beyond it, in float32 or on nudged inputs, are near-ties (see TIE_FACTOR).
    """
    noise = rounding_noise(approx, exact)
    if not approx.is_floating_point() or approx.shape != exact.shape or approx.numel() == 0:
        return Allowance(noise)
    usable = isinstance(moved, torch.Tensor) and moved.shape == exact.shape
    others = [approx, moved] if usable else [approx]
    counts = [misses(other, exact, atol + noise, rtol) for other in others]
    if None in counts:
        return Allowance(noise)  # NaN or Inf where exact arithmetic has none: not ties
    fraction = max(c or 0 for c in counts) / approx.numel()
    return Allowance(noise, TIE_FACTOR * fraction if fraction <= TIE_CAP else 0.0)


def misses(approx: torch.Tensor, exact: torch.Tensor, atol: float, rtol: float) -> int | None:
    """Elements of `approx` outside the tolerance of `exact` (None: NaN or Inf differ).

    In pieces of TIE_PIECE elements: it runs beside a float64 reference and its inputs.
    """
    device = exact.device
    missed = torch.zeros((), dtype=torch.int64, device=device)
    nonfinite_differs = torch.zeros((), dtype=torch.bool, device=device)
    for exact_piece, approx_piece in pieces(exact, approx, limit=TIE_PIECE):
        want = exact_piece.to(device, torch.float64)  # never changed in place: maybe a view
        got = approx_piece.to(device, torch.float64, copy=True)
        nonfinite_differs |= (torch.isfinite(want) != torch.isfinite(got)).any()
        missed += (got.sub_(want).abs_() > want.abs().mul_(rtol).add_(atol)).sum()
        del want, got
    differs, count = host_values([nonfinite_differs, missed])
    return None if differs else int(count)


def nudged(value: object) -> object:
    """A floating-point tensor moved by up to TIE_NUDGE of itself, at random, in float64
    (anything else as it is): inputs on which near-ties go either way."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    scale = torch.rand(value.shape, dtype=torch.float64, device=value.device)
    return scale.mul_(2 * TIE_NUDGE).add_(1 - TIE_NUDGE).mul_(value)


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
