"""Outputs judged against the reference, allowing for the reference's own rounding.

`compare` holds the pure comparison; this module is the grader's use of it: every output
of a call compared with one read from the device, the float32 reference's error measured
against a float64 run the first time an output misses by value alone (cached per
problem), a reference with too many NaN or Inf values refused as an ill-posed problem,
and cheap fingerprints that tell a cached answer from a fresh one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from sandbox import compare
from sandbox.grading.job import ProblemEntry, Rejected
from sandbox.grading.stages import stage
from sandbox.problem import Problem
from sandbox.result import VerifyResult

# At most this fraction of a reference's values may be NaN or Inf (`check_reference`),
# or STRAY_DRAWS stray input values' worth, where a small input is broadcast over the
# output (an exact 0.0 in a [3968, 148, 1] divisor is a row of 1,827 Infs), within
# NONFINITE_CAP of the output.
NONFINITE_LIMIT = 1e-6
STRAY_DRAWS = 2
NONFINITE_CAP = 1e-3
# Below this many bytes the reference and outputs stay on the GPU while the float64
# reference runs (`parked`): moving them costs more than the room it makes.
PARK_MIN_BYTES = 1 << 28


def compare_all(
    expected: list[torch.Tensor],
    outputs: list[torch.Tensor],
    atol: float,
    rtol: float,
    noise: list[compare.Allowance] | None,
    also: tuple[torch.Tensor, ...] = (),
) -> tuple[list[compare.Comparison], list[float]]:
    """Outputs against references, each within its allowance for the reference's own error;
    and the values of the device scalars `also`. One read from the device for all."""
    allowances = noise or [compare.Allowance()] * len(expected)
    pending = [
        compare.measure(ref, got, atol + extra.atol, rtol, extra.allowed(ref.numel()))
        for ref, got, extra in zip(expected, outputs, allowances, strict=True)
    ]
    measured, values = compare.conclude(pending, *also)
    comparisons = []
    for comparison, extra in zip(measured, allowances, strict=True):
        if extra.atol and not comparison.passed:
            note = f" (atol {atol:g} + {extra.atol:.3g} for the reference's own float32 rounding)"
            comparison = replace(comparison, message=comparison.message + note)
        comparisons.append(comparison)
    return comparisons, values


def compare_outputs(
    entry: ProblemEntry,
    inputs: list[Any],
    expected: list[torch.Tensor],
    outputs: list[torch.Tensor],
    atol: float,
    rtol: float,
    result: VerifyResult,
) -> list[compare.Comparison]:
    """Each output against the reference, allowing for the reference's own rounding."""
    comparisons, _ = compare_all(expected, outputs, atol, rtol, entry.noise)
    return allow_for_rounding(entry, inputs, expected, outputs, comparisons, atol, rtol, result)


def allow_for_rounding(
    entry: ProblemEntry,
    inputs: list[Any],
    expected: list[torch.Tensor],
    outputs: list[torch.Tensor],
    comparisons: list[compare.Comparison],
    atol: float,
    rtol: float,
    result: VerifyResult,
) -> list[compare.Comparison]:
    """The comparisons again with the reference's rounding allowed for, the first time
    an output misses the tolerance by value alone.

    The allowance is measured once per problem, on that call's inputs (which `inputs`
    still holds as the grader drew them). While the float64 reference runs, the
    reference and the outputs wait in host memory when they are large (`parked`) and
    the inputs are widened in place: on the GPU the grader holds the float64 run alone.
    """
    if entry.noise is not None or not any(c.out_of_tolerance for c in comparisons):
        return comparisons
    # A few misses may be near-ties: worth a second float64 run on nudged inputs.
    ties = [
        c.out_of_tolerance and c.mismatch_fraction <= compare.TIE_FACTOR * compare.TIE_CAP
        for c in comparisons
    ]
    with stage(result, "rounding.float64"), parked(expected, outputs):
        noise = rounding_noise(entry.problem, inputs, expected, atol, rtol, ties)
    if noise is None:
        return comparisons
    entry.noise = noise
    return compare_all(expected, outputs, atol, rtol, noise)[0]


def rounding_noise(
    problem: Problem,
    inputs: list[Any],
    expected: list[torch.Tensor],
    atol: float,
    rtol: float,
    ties: Sequence[bool] = (),
) -> list[compare.Allowance] | None:
    """Per output, what the float32 reference's own error allows (None: not now).

    `inputs` are widened to float64 in place while the float64 reference runs, and
    narrowed back after (exactly): their float32 copies are not held beside it. Where
    `ties` says an output may hold near-ties, the float64 reference runs again on
    nudged inputs (`compare.allowance`).
    """
    with widened_in_place(inputs):
        exact: list[Any] | None = None
        try:
            full = False
            try:
                exact = problem.reference_float64(inputs)
            except torch.cuda.OutOfMemoryError:
                full = True  # handled outside: the error's frames hold GPU memory
            device = "cpu" if full else None
            if full:
                # No room on the GPU for float64 copies of GiB tensors: the host has
                # more (a whole-tensor layer_norm was judged wrong for want of this
                # allowance).
                torch.cuda.empty_cache()
                exact = problem.reference_float64(inputs, device=device)
        except MemoryError:
            return None  # not now; another call may have room
        except Exception:  # noqa: BLE001 - no float64 version of this problem: no allowance
            return [compare.Allowance()] * len(expected)
        if exact is None or len(exact) != len(expected):
            return [compare.Allowance()] * len(expected)
        tied = list(ties) or [False] * len(exact)
        moved = nudged_reference(problem, inputs, device) if any(tied) else None
        if moved is None or len(moved) != len(exact):
            moved = [None] * len(exact)
        noise = [
            compare.allowance(a, b, atol, rtol, m if tie else None)
            for a, b, m, tie in zip(expected, exact, moved, tied, strict=True)
        ]
        del exact, moved  # before the inputs are narrowed back
    return noise


@contextlib.contextmanager
def parked(*groups: list[Any]) -> Iterator[None]:
    """The GPU tensors of these lists moved to host memory for the block, their device
    memory freed (where nothing else holds them), then moved back: room for the float64
    reference of a GiB problem beside nothing but itself."""
    moved = [
        (group, i, value.device)
        for group in groups
        for i, value in enumerate(group)
        if isinstance(value, torch.Tensor) and value.device.type == "cuda"
    ]
    if sum(g[i].numel() * g[i].element_size() for g, i, _ in moved) < PARK_MIN_BYTES:
        moved = []
    for group, i, _ in moved:
        group[i] = group[i].cpu()
    try:
        yield
    finally:
        for group, i, device in moved:
            group[i] = group[i].to(device)


def nudged_reference(problem: Problem, inputs: list[Any], device: str | None) -> list[Any] | None:
    """The float64 reference on inputs `compare.nudged` (None: no room, or it failed);
    on the host where the GPU has no room for it beside the first float64 run."""
    for where in (device, "cpu") if device is None else (device,):
        try:
            moved = problem.reference_float64([compare.nudged(x) for x in inputs], device=where)
        except torch.cuda.OutOfMemoryError:
            moved = None  # handled outside: the error's frames hold GPU memory
        except Exception:  # noqa: BLE001 - no memory, or as the first float64 run: no allowance
            return None
        if isinstance(moved, list):
            return moved
        torch.cuda.empty_cache()
    return None


@contextlib.contextmanager
def widened_in_place(values: list[Any]) -> Iterator[None]:
    """The floating-point tensors of `values` replaced by float64 copies for the block, one
    at a time (each original freed as its copy is made, where nothing else holds it), and
    narrowed back after: exact both ways. A tensor given twice stays one tensor."""
    first: dict[int, int] = {}  # id of a tensor -> the index where it first appears
    # (A comprehension: no loop variable left holding a float32 tensor.)
    dtypes = {
        i: (first.setdefault(id(value), i), value.dtype)
        for i, value in enumerate(values)
        if isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype != torch.float64
    }
    for i, (origin, _) in dtypes.items():
        values[i] = values[i].double() if origin == i else values[origin]
    try:
        yield
    finally:
        for i, (origin, dtype) in dtypes.items():
            values[i] = values[i].to(dtype) if origin == i else values[origin]


def check_reference(expected: list[torch.Tensor], inputs: Sequence[Any] = ()) -> None:
    """Reject a problem whose answer is more than a few stray NaN or Inf values.

    A handful are a property of the draw, not of the problem: a GPU's normal sampler
    returns an exact 0.0 about once in 2^24 draws, so every GiB-sized `div` has a few
    Infs, and a whole broadcast row of them where the 0.0 is in a small input. The
    candidate must then match them exactly (`compare.compare_tensor`). Counted chunk
    by chunk, and read back at once."""
    checked = [(i, out) for i, out in enumerate(expected) if out.is_floating_point()]
    _, counts = compare.conclude([], *(compare.nonfinite(out) for _, out in checked))
    smallest = min(
        (x.numel() for x in inputs if isinstance(x, torch.Tensor) and x.numel()), default=0
    )
    for (i, out), count in zip(checked, counts, strict=True):
        nonfinite = int(count)
        spread = out.numel() // smallest if smallest else 0  # outputs one input value makes
        limit = max(NONFINITE_LIMIT * out.numel(), STRAY_DRAWS * spread)
        if nonfinite > min(limit, max(NONFINITE_LIMIT, NONFINITE_CAP) * out.numel()):
            raise Rejected(
                "bad_problem",
                f"reference output {i} contains NaN or Inf ({nonfinite} of {out.numel()} values)",
            )


def fingerprint(tensor: torch.Tensor) -> tuple[Any, ...]:
    """A cheap summary that tells two outputs apart (for the "cached?" hint only).

    Left on the device: it is read back only when a trial fails (`same_fingerprints`).
    """
    flat = tensor.detach().reshape(-1)
    step = max(1, flat.numel() // 4096)
    total = torch.sum(flat, dtype=torch.float64)  # 0 when empty
    return tuple(tensor.shape), str(tensor.dtype), total, flat[::step].clone()


def same_fingerprints(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Whether two trials' outputs have the same fingerprints (NaN sums match as text)."""
    if [f[:2] for f in a] != [f[:2] for f in b]:
        return False
    totals = compare.host_values([f[2] for f in (*a, *b)])
    if [repr(t) for t in totals[: len(a)]] != [repr(t) for t in totals[len(a) :]]:
        return False
    return all(
        x[3].cpu().view(torch.uint8).numpy().tobytes()
        == y[3].cpu().view(torch.uint8).numpy().tobytes()
        for x, y in zip(a, b, strict=True)
    )
