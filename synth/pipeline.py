"""From an operator list to one validated program: wire, skeleton, solve, print, check.

`instantiate` turns a DAG into a `Candidate` (program + the skeleton and solution it came
from); `validate_candidate` runs the profile's checks on it. Both are deterministic
functions of their random stream, so callers can retry with fresh streams.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from synth.dag import Dag, wire
from synth.dims import Conflict
from synth.operators import Params
from synth.profiles import Profile
from synth.program import Program
from synth.ranks import RankCSP
from synth.skeleton import Skeleton, sample_skeleton
from synth.solve import Bounds, Solution, band_floor, propose, smallest, solve

SKELETON_TRIES = 4
"""Skeletons drawn per DAG while looking for one that reaches the FLOPs band (and, for
scaled validation, has a CPU-sized copy)."""
SCALED_TARGET_FLOPS = 2**15
"""Typical FLOPs of a scaled-down copy (more only where the program needs it)."""
SCALED_LIMIT_ELEMENTS = 2**19
SCALED_LIMIT_FLOPS = 2**23
"""A skeleton whose smallest scaled-down copy exceeds these cannot be validated cheaply on
a CPU; another skeleton (smaller kernels, strides) of the same DAG is drawn instead."""


@dataclass(frozen=True)
class Candidate:
    program: Program
    skeleton: Skeleton
    solution: Solution


def instantiate(
    dag: Dag,
    profile: Profile,
    rng: random.Random,
    csp: RankCSP | None = None,
    fixed_ranks: Mapping[int, int] | None = None,
    fixed_params: Mapping[int, Params] | None = None,
) -> Candidate | None:
    """Draw skeletons for the DAG and solve the best one; None when none works."""
    bounds = Bounds.of(profile)
    if csp is None:
        try:
            csp = dag.rank_csp()
        except ValueError:  # no rank assignment exists for this wiring
            return None
    best: tuple[int, Skeleton, list[int]] | None = None
    for _ in range(SKELETON_TRIES):
        try:
            sk = sample_skeleton(
                dag, csp, profile, rng, fixed_ranks=fixed_ranks, fixed_params=fixed_params
            )
            if profile.validation == "scaled" and not _scales_down(sk, profile):
                continue
            low, high = bounds.flops_min.bit_length() - 1, bounds.flops_max.bit_length() - 1
            target = max(int(2 ** rng.uniform(low, high)), bounds.flops_min)
            hint = propose(sk, bounds, rng, target)
        except Conflict:
            continue
        floor = band_floor(bounds, sk.evaluate(hint)[2])
        if best is None or floor > best[0]:
            best = (floor, sk, hint)
        if floor >= bounds.flops_min:
            break
    if best is None:
        return None
    _, sk, hint = best
    try:
        sol = solve(sk, bounds, rng, hint=hint)
    except Conflict:
        return None
    return Candidate(_assemble(sk, sol), sk, sol)


def _assemble(sk: Skeleton, sol: Solution) -> Program:
    nodes = [(n.op, n.inputs, n.output, p) for n, p in zip(sk.dag.nodes, sk.params, strict=True)]
    return Program.assemble(sk.dag.inputs, nodes, sol.shapes)


def build_candidate(ops: Sequence[str], profile: Profile, rng: random.Random) -> Candidate | None:
    """Wire the operators into a DAG and instantiate it."""
    dag, csp = wire(ops, rng)
    return instantiate(dag, profile, rng, csp)


def validate_candidate(cand: Candidate, profile: Profile, rng: random.Random) -> str | None:
    """None when the program is kept, else the reason it is not (cheapest checks first)."""
    from synth import validate  # torch is imported only where programs are run

    seed = rng.randrange(2**31)
    if profile.validation == "real":
        bad = validate.check_values(cand.program, seed)
        return bad.reason if bad else None
    scaled = scaled_copy(cand, profile, rng)
    if scaled is None:
        return "no scaled-down copy fits the validation bounds"
    bad = validate.check_values(scaled, seed)
    if bad:
        return f"scaled copy: {bad.reason}"
    bad = validate.check_meta_shapes(cand.program)
    return bad.reason if bad else None


def _smallest_copy(
    sk: Skeleton,
    bounds: Bounds,
    lo: Sequence[int] | None = None,
    hi: Sequence[int] | None = None,
) -> tuple[int, int, int]:
    """(largest tensor, total elements, FLOPs) of the skeleton with every dim near its minimum."""
    sizes, total, flops = sk.evaluate(smallest(sk, bounds, lo, hi))
    return max(sizes, default=1), total, flops


def _scales_down(sk: Skeleton, profile: Profile) -> bool:
    """Whether a scaled-down copy of this skeleton can be run cheaply on a CPU."""
    assert profile.scaled is not None
    _, total, flops = _smallest_copy(sk, Bounds.of(profile.scaled))
    return total <= SCALED_LIMIT_ELEMENTS and flops <= SCALED_LIMIT_FLOPS


def scaled_copy(cand: Candidate, profile: Profile, rng: random.Random) -> Program | None:
    """The same program with small dims: same operators, wiring and parameters. A dim
    that is 1 stays 1 and, where the budget allows, every other dim stays >= 2, so
    broadcasting and reductions keep their structure."""
    assert profile.scaled is not None
    sk = cand.skeleton
    bounds = Bounds.of(profile.scaled)
    values = cand.solution.values
    base = sk.problem.lo
    strict = [1 if v == 1 else max(2, b) for v, b in zip(values, base, strict=True)]
    loose = [1 if v == 1 else b for v, b in zip(values, base, strict=True)]
    hi = [1 if v == 1 else bounds.max_dim for v in values]
    try:
        for lo in (strict, loose):
            # Some programs cannot be small (a 15^3 kernel with 16 groups): make room
            # for their smallest instance, and not much more.
            largest, total, flops = _smallest_copy(sk, bounds, lo, hi)
            if total <= SCALED_LIMIT_ELEMENTS and flops <= SCALED_LIMIT_FLOPS:
                break
        else:
            return None
        bounds = dataclasses.replace(
            bounds,
            max_elements=max(bounds.max_elements, largest + largest // 4),
            max_total_elements=max(bounds.max_total_elements, total + total // 4),
            flops_max=max(bounds.flops_max, flops + flops // 4),
        )
        target = min(bounds.flops_max, max(4 * flops, SCALED_TARGET_FLOPS))
        hint = propose(sk, bounds, rng, target, lo, hi)
        sol = solve(sk, bounds, rng, lo, hi, hint=hint)
    except Conflict:
        return None
    return _assemble(sk, sol)
