"""Dimension sizes: a randomised hint, then one CP-SAT solve per program.

The CP-SAT model (`build_model`) holds one integer variable per class of equal dims of
the skeleton, the linear relations between classes (cat sums, window sizes, groups),
one product variable per distinct tensor shape and FLOPs term (n-ary products built as
chains of binary `AddMultiplicationEquality`, shared by prefix), and the profile's
bounds: every dim in [1, max_dim], every tensor <= max_elements, inputs >=
min_input_elements, all tensors together <= max_total_elements, total FLOPs in
[floor, flops_max].

Sampling among the feasible solutions is done by the hint (`propose`): every free class
gets a random log-weight, all classes grow together by a common scale found by
bisection until a randomly drawn FLOPs target or a size bound is hit, then random single
classes keep doubling while that stays within bounds. The result is a complete
assignment, usually feasible, which CP-SAT accepts or repairs. So two solves of one DAG
with different seeds give different, "natural" shapes (no extreme corner solutions),
and the solver stays in the millisecond range.

DAGs whose FLOPs cannot reach the band (one elementwise op moves at most
max_elements FLOPs) get their FLOPs floor halved until the hint reaches it; the floor
actually used is returned with the solution. The upper bound is never relaxed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from synth.dims import Conflict, tighten
from synth.profiles import Profile
from synth.skeleton import Skeleton

GROWTH_STEPS = 24
"""Single-class growth steps after the common-scale bisection of the hint."""
SAFETY_WALL_SECONDS = 30.0
"""Wall-clock backstop; the real limit is deterministic so results do not depend on load."""


@dataclass(frozen=True)
class Bounds:
    max_dim: int
    max_elements: int
    max_total_elements: int
    min_input_elements: int
    flops_min: int
    flops_max: int
    deterministic_time: float

    @staticmethod
    def of(profile: Profile) -> Bounds:
        return Bounds(
            profile.max_dim,
            profile.max_elements,
            profile.max_total_elements,
            profile.min_input_elements,
            profile.flops_min,
            profile.flops_max,
            profile.solver_deterministic_time,
        )


@dataclass(frozen=True)
class Solution:
    values: tuple[int, ...]
    """Per root (class of equal dims)."""
    shapes: tuple[tuple[int, ...], ...]
    """Per tensor."""
    flops: int
    flops_floor: int
    """The FLOPs lower bound the solve used (flops_min, or lower by halving)."""


# -- evaluation of an assignment -------------------------------------------------------------
def evaluate(sk: Skeleton, values: Sequence[int]) -> tuple[list[int], int, int]:
    """(element count per tensor, total elements, total FLOPs)."""
    return sk.evaluate(values)


def check(sk: Skeleton, bounds: Bounds, values: Sequence[int], floor: int) -> bool:
    """Whether an assignment satisfies every constraint of the model (pure Python)."""
    pb = sk.problem
    for r, v in enumerate(values):
        hi = pb.hi[r] if pb.hi[r] is not None else bounds.max_dim
        if not pb.lo[r] <= v <= min(hi, bounds.max_dim):
            return False
    for terms, lo, hi in pb.relations:
        s = sum(c * values[r] for c, r in terms)
        if (lo is not None and s < lo) or (hi is not None and s > hi):
            return False
    sizes, total, flops = evaluate(sk, values)
    if max(sizes, default=0) > bounds.max_elements or total > bounds.max_total_elements:
        return False
    for t in sk.dag.inputs:
        if sk.ranks[t] and sizes[t] < bounds.min_input_elements:
            return False
    return floor <= flops <= bounds.flops_max


# -- the hint --------------------------------------------------------------------------------
def _limits(
    sk: Skeleton, bounds: Bounds, lo: Sequence[int] | None, hi: Sequence[int] | None
) -> tuple[list[int], list[int]]:
    pb = sk.problem
    los = list(lo) if lo is not None else list(pb.lo)
    his = [min(h if h is not None else bounds.max_dim, bounds.max_dim) for h in pb.hi]
    if hi is not None:
        his = [min(a, b) for a, b in zip(his, hi, strict=True)]
    tighten(los, his, pb.relations)
    return los, his


def propose(
    sk: Skeleton,
    bounds: Bounds,
    rng: random.Random,
    target: int,
    lo: Sequence[int] | None = None,
    hi: Sequence[int] | None = None,
) -> list[int]:
    """A random assignment that grows toward `target` FLOPs within the size bounds."""
    pb = sk.problem
    los, his = _limits(sk, bounds, lo, hi)
    derived = {r for r, _, _ in pb.defs}
    free = [r for r in range(pb.n_roots) if los[r] < his[r] and r not in derived]
    weights = {r: rng.uniform(0.2, 1.0) for r in free}
    clamp = _clamper(pb.mult, los, his)

    def fits(values: list[int]) -> int | None:
        """The FLOPs of `values` if they respect the size bounds and the target."""
        sizes, total, flops = sk.evaluate(values)
        if (
            max(sizes, default=0) <= bounds.max_elements
            and total <= bounds.max_total_elements
            and flops <= target
        ):
            return flops
        return None

    def at_scale(s: float) -> dict[int, int]:
        return {r: clamp(r, round(los[r] * 2.0 ** (s * weights[r]))) for r in free}

    lo_s, hi_s = 0.0, math.log2(bounds.max_dim) + 1
    best = at_scale(0.0)
    values = _assign(pb, los, best, clamp)
    reached = fits(values)
    if reached is not None:
        for _ in range(12):
            mid = (lo_s + hi_s) / 2
            cand = at_scale(mid)
            cand_values = _assign(pb, los, cand, clamp)
            flops = fits(cand_values)
            if flops is not None:
                lo_s, best, values, reached = mid, cand, cand_values, flops
            else:
                hi_s = mid
        # spend the remaining slack on random single classes
        for _ in range(min(2 * len(free), GROWTH_STEPS)):
            if 2 * reached >= target and reached >= bounds.flops_min:
                break
            r = rng.choice(free)
            grown = dict(best)
            grown[r] = clamp(
                r, best[r] * 2 if rng.random() < 0.5 else best[r] + max(1, best[r] // 2)
            )
            if grown[r] == best[r]:
                continue
            cand_values = _assign(pb, los, grown, clamp)
            flops = fits(cand_values)
            if flops is not None:
                best, values, reached = grown, cand_values, flops
    repair(values, pb.relations, los, his, pb.mult)
    return values


def smallest(
    sk: Skeleton, bounds: Bounds, lo: Sequence[int] | None = None, hi: Sequence[int] | None = None
) -> list[int]:
    """Every free class at its lower bound, derived classes computed from them."""
    los, his = _limits(sk, bounds, lo, hi)
    values = _assign(sk.problem, los, {}, _clamper(sk.problem.mult, los, his))
    repair(values, sk.problem.relations, los, his, sk.problem.mult)
    return values


def _clamper(
    mult: Sequence[int], los: Sequence[int], his: Sequence[int]
) -> Callable[[int, int], int]:
    def clamp(r: int, v: int) -> int:
        m = mult[r]
        if m > 1:
            v = max(m, (v // m) * m)
        return min(max(v, los[r]), his[r])

    return clamp


def _assign(
    pb, los: Sequence[int], base: dict[int, int], clamp: Callable[[int, int], int]
) -> list[int]:
    """Values for every root: `base` for free ones, forward derivation for derived ones."""
    values = list(los)
    for r, v in base.items():
        values[r] = v
    for r, fn, deps in pb.defs:
        values[r] = clamp(r, fn(*[values[d] for d in deps]))
    return values


def repair(
    values: list[int],
    relations: Sequence[tuple[tuple[tuple[int, int], ...], int | None, int | None]],
    los: Sequence[int],
    his: Sequence[int],
    mult: Sequence[int],
    passes: int = 3,
) -> None:
    """Fix violated linear relations in place by moving one class per relation (the last
    one that can move far enough). Where a class has two derivations (two windows whose
    outputs are added, say) the forward evaluation satisfies only one; this usually
    makes the hint feasible, which saves CP-SAT the search."""
    for _ in range(passes):
        clean = True
        for terms, rlo, rhi in relations:
            total = sum(c * values[r] for c, r in terms)
            if (rlo is None or total >= rlo) and (rhi is None or total <= rhi):
                continue
            clean = False
            for c, r in reversed(terms):
                if los[r] == his[r]:
                    continue
                rest = total - c * values[r]
                lo_t = None if rlo is None else rlo - rest
                hi_t = None if rhi is None else rhi - rest
                if c < 0:
                    lo_t, hi_t = (
                        (None if hi_t is None else -hi_t),
                        (None if lo_t is None else -lo_t),
                    )
                step = abs(c)
                low = los[r] if lo_t is None else max(los[r], -((-lo_t) // step))
                high = his[r] if hi_t is None else min(his[r], hi_t // step)
                m = mult[r]
                if m > 1:
                    low = -((-low) // m) * m
                    high = (high // m) * m
                if low <= high:
                    values[r] = min(max(values[r], low), high)
                    break
        if clean:
            return


# -- the CP-SAT model ------------------------------------------------------------------------
_Key = tuple[int, ...]
"""A product of variable roots: their indices, sorted (repeats kept)."""
_SizeKey = tuple[int, _Key]
"""A product as (constant factor, variable roots): the constant is the fixed roots' product."""


def build_model(
    sk: Skeleton,
    bounds: Bounds,
    floor: int,
    hint: Sequence[int],
    lo: Sequence[int] | None = None,
    hi: Sequence[int] | None = None,
) -> tuple[cp_model.CpModel, list[cp_model.LinearExprT]]:
    """The CP-SAT model of the skeleton's dims; returns it and one expression per root.

    Variables and constraints are added in a fixed order (roots, relations, products,
    size bounds, FLOPs band): CP-SAT's search, so the solution for a seed, depends on it.
    """
    pb = sk.problem
    los, his = _limits(sk, bounds, lo, hi)
    if any(a > b for a, b in zip(los, his, strict=True)):
        raise Conflict("a dimension's bounds are empty under this profile")
    model = cp_model.CpModel()
    roots = _root_vars(model, los, his, hint)
    _add_relations(model, pb.relations, roots)
    sizes, needs_min = _tensor_sizes(sk, bounds, roots)
    terms = _flop_terms(sk, roots)
    products = _product_vars(model, _product_caps(bounds, sizes, terms), roots, los, hint)

    def expr_of(key: _Key) -> cp_model.LinearExprT:
        """The expression of a variable product: 1, a root, or its product variable."""
        if not key:
            return 1
        return roots[key[0]] if len(key) == 1 else products[key]

    _add_size_bounds(model, bounds, sizes, needs_min, expr_of)
    total = sum(coef * expr_of(key) for key, coef in terms.items())
    model.add(total <= bounds.flops_max)
    if floor > 1:
        model.add(total >= floor)
    return model, roots


def _root_vars(
    model: cp_model.CpModel, los: Sequence[int], his: Sequence[int], hint: Sequence[int]
) -> list[cp_model.LinearExprT]:
    """One expression per root: its constant when its bounds meet, else a hinted variable."""
    roots: list[cp_model.LinearExprT] = []
    for r, (low, high) in enumerate(zip(los, his, strict=True)):
        if low == high:
            roots.append(low)
        else:
            v = model.new_int_var(low, high, f"d{r}")
            model.add_hint(v, min(max(hint[r], low), high))
            roots.append(v)
    return roots


def _add_relations(
    model: cp_model.CpModel,
    relations: Sequence[tuple[tuple[tuple[int, int], ...], int | None, int | None]],
    roots: Sequence[cp_model.LinearExprT],
) -> None:
    """The linear relations between roots (an equality where both bounds agree)."""
    for terms, rlo, rhi in relations:
        expr = sum(c * roots[r] for c, r in terms)
        if rlo is not None and rlo == rhi:
            model.add(expr == rlo)
        else:
            if rlo is not None:
                model.add(expr >= rlo)
            if rhi is not None:
                model.add(expr <= rhi)


def _split(factors: Sequence[int], roots: Sequence[cp_model.LinearExprT]) -> _SizeKey:
    """A product of roots as (product of the constant ones, sorted variable ones)."""
    const, var_roots = 1, []
    for r in factors:
        if isinstance(roots[r], int):
            const *= roots[r]
        else:
            var_roots.append(r)
    return const, tuple(sorted(var_roots))


def _tensor_sizes(
    sk: Skeleton, bounds: Bounds, roots: Sequence[cp_model.LinearExprT]
) -> tuple[dict[_SizeKey, int], set[_SizeKey]]:
    """Every distinct tensor size with how many tensors have it, and the sizes of inputs
    (rank >= 1) that must reach min_input_elements."""
    sizes: dict[_SizeKey, int] = {}  # (const, key) -> tensor count
    needs_min: set[_SizeKey] = set()
    inputs = set(sk.dag.inputs)
    for t, dims in enumerate(sk.tensor_dims):
        sk_key = _split(dims, roots)
        if sk_key[0] > bounds.max_elements:
            raise Conflict("a tensor exceeds max_elements")
        sizes[sk_key] = sizes.get(sk_key, 0) + 1
        if t in inputs and sk.ranks[t]:
            needs_min.add(sk_key)
    return sizes, needs_min


def _flop_terms(sk: Skeleton, roots: Sequence[cp_model.LinearExprT]) -> dict[_Key, int]:
    """The FLOPs as a sum over distinct variable products, constants in the coefficients."""
    terms: dict[_Key, int] = {}  # key -> summed coefficient
    for coef, factors in sk.flop_terms:
        const, key = _split(factors, roots)
        terms[key] = terms.get(key, 0) + coef * const
    return terms


def _product_caps(
    bounds: Bounds, sizes: dict[_SizeKey, int], terms: dict[_Key, int]
) -> dict[_Key, int]:
    """Upper bounds for the product variables: every prefix (two roots or more) of a
    tensor size or a FLOPs term.

    A prefix of a product is at most the product, so it inherits the smallest cap: a
    tensor's from max_elements, a FLOPs term's from flops_max.
    """
    cap: dict[_Key, int] = {}
    for const, key in sizes:
        for n in range(2, len(key) + 1):
            cap[key[:n]] = min(
                cap.get(key[:n], bounds.max_elements // const), bounds.max_elements // const
            )
    for key, coef in terms.items():
        limit = max(1, bounds.flops_max // coef)
        for n in range(2, len(key) + 1):
            cap[key[:n]] = min(cap.get(key[:n], limit), limit)
    return cap


def _product_vars(
    model: cp_model.CpModel,
    cap: dict[_Key, int],
    roots: Sequence[cp_model.LinearExprT],
    los: Sequence[int],
    hint: Sequence[int],
) -> dict[_Key, cp_model.LinearExprT]:
    """One hinted variable per capped product, each a binary product of its prefix's and
    its last root: chains shared by prefix, shortest first."""
    products: dict[_Key, cp_model.LinearExprT] = {}
    for key in sorted(cap, key=len):
        low = math.prod(los[r] for r in key)
        if low > cap[key]:
            raise Conflict("smallest dims already exceed a bound")
        p = model.new_int_var(low, cap[key], "")
        prev = products[key[:-1]] if len(key) > 2 else roots[key[0]]
        model.add_multiplication_equality(p, [prev, roots[key[-1]]])
        model.add_hint(p, min(max(math.prod(hint[r] for r in key), low), cap[key]))
        products[key] = p
    return products


def _add_size_bounds(
    model: cp_model.CpModel,
    bounds: Bounds,
    sizes: dict[_SizeKey, int],
    needs_min: set[_SizeKey],
    expr_of: Callable[[_Key], cp_model.LinearExprT],
) -> None:
    """Per tensor size max_elements (and min_input_elements for inputs); all tensors
    together max_total_elements."""
    for const, key in sizes:
        if len(key) == 1:  # longer products carry the bound in their domain
            model.add(const * expr_of(key) <= bounds.max_elements)
        if (const, key) in needs_min:
            model.add(const * expr_of(key) >= bounds.min_input_elements)
    model.add(
        sum(count * const * expr_of(key) for (const, key), count in sizes.items())
        <= bounds.max_total_elements
    )


def solve_once(
    sk: Skeleton,
    bounds: Bounds,
    floor: int,
    hint: Sequence[int],
    seed: int,
    lo: Sequence[int] | None = None,
    hi: Sequence[int] | None = None,
) -> list[int] | None:
    model, roots = build_model(sk, bounds, floor, hint, lo, hi)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.num_workers = 1
    params.random_seed = seed
    params.max_deterministic_time = bounds.deterministic_time
    params.max_time_in_seconds = SAFETY_WALL_SECONDS
    # Small nonlinear models: LP relaxation, probing and symmetry detection cost far more
    # than they save here (measured: 4x less solver time, fewer time-outs).
    params.linearization_level = 0
    params.cp_model_probing_level = 0
    params.symmetry_level = 0
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [r if isinstance(r, int) else int(solver.value(r)) for r in roots]


def band_floor(bounds: Bounds, reached: int) -> int:
    """flops_min, halved until `reached` meets it."""
    floor = bounds.flops_min
    while floor > 1 and floor > reached:
        floor //= 2
    return max(floor, 1)


def solve(
    sk: Skeleton,
    bounds: Bounds,
    rng: random.Random,
    lo: Sequence[int] | None = None,
    hi: Sequence[int] | None = None,
    hint: Sequence[int] | None = None,
    retries: int = 1,
) -> Solution:
    """Sizes for every dim of the skeleton. Raises `Conflict` when none is found."""
    if hint is None:
        target = round(2.0 ** rng.uniform(math.log2(bounds.flops_min), math.log2(bounds.flops_max)))
        hint = propose(sk, bounds, rng, max(target, bounds.flops_min), lo, hi)
    _, _, reached = evaluate(sk, hint)
    floor = band_floor(bounds, reached)
    for _ in range(retries + 1):
        values = solve_once(sk, bounds, floor, hint, rng.randrange(2**31), lo, hi)
        if values is not None:
            sizes, _, flops = evaluate(sk, values)
            shapes = tuple(tuple(values[r] for r in dims) for dims in sk.tensor_dims)
            return Solution(tuple(values), shapes, flops, floor)
        if floor == 1:
            break
        floor = max(1, floor // 2)
    raise Conflict("no dimension sizes satisfy the profile")
