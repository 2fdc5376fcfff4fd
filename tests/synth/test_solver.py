"""The pieces under the pipeline: rank CSP, dim system, bound propagation, CP-SAT model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synth.dag import choose_ops, wire
from synth.dims import Conflict, DimSystem
from synth.operators import OPERATOR_NAMES, REGISTRY
from synth.profiles import PAPER, TINY
from synth.skeleton import sample_skeleton
from synth.solve import Bounds, check, propose, solve, tighten


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 60),
    k=st.integers(1, 7),
    s=st.integers(1, 4),
    d=st.integers(1, 3),
    data=st.data(),
)
def test_window_relation_has_exactly_the_floor_formula_as_solution(
    n: int, k: int, s: int, d: int, data
) -> None:
    p = data.draw(st.integers(0, d * (k - 1) // 2))
    m = DimSystem()
    x = m.new()
    out = m.window(x, k, s, p, d)
    pb = m.freeze()
    ((terms, lo, hi),) = pb.relations
    rx, ro = pb.atom_root[x], pb.atom_root[out]
    coef = dict((r, c) for c, r in terms)
    admitted = [o for o in range(1, 200) if lo <= coef[rx] * n + coef[ro] * o <= hi]
    q = n + 2 * p - d * (k - 1) - 1
    assert admitted == ([q // s + 1] if q >= 0 else [])


def test_union_find_catches_contradictions() -> None:
    m = DimSystem()
    a = m.new()
    m.at_least(a, 2)
    with pytest.raises(Conflict):
        m.unify(a, m.ONE)
    m = DimSystem()
    with pytest.raises(Conflict):
        m.unify(m.const(3), m.const(5))


def test_tighten_propagates_and_detects() -> None:
    los, his = [1, 1], [100, 100]
    tighten(los, his, [(((1, 0), (-3, 1)), 2, 4)])  # 2 <= x - 3y <= 4
    assert los == [5, 1] and his == [100, 32]
    with pytest.raises(Conflict):
        tighten([1], [100], [(((1, 0),), 0, 0)])  # x == 0


@settings(max_examples=25, deadline=None)
@given(level=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_rank_solutions_satisfy_every_operator_table(level: int, seed: int) -> None:
    rng = random.Random(seed)
    dag, csp = wire(choose_ops(level, OPERATOR_NAMES, rng), rng)
    solved = csp.solve(rng)
    assert solved is not None
    ranks, rparams = solved
    for node, rp in zip(dag.nodes, rparams, strict=True):
        row = (*(ranks[t] for t in node.inputs), ranks[node.output])
        assert (row, rp) in [(r, p) for r, p in REGISTRY[node.op].rank_table]


@pytest.mark.parametrize("profile", [TINY, PAPER], ids=lambda p: p.name)
def test_cpsat_solutions_satisfy_the_python_model(profile) -> None:
    """Whatever CP-SAT returns passes the independent Python check of every bound."""
    bounds = Bounds.of(profile)
    solved = 0
    for seed in range(40):
        rng = random.Random(seed)
        dag, csp = wire(choose_ops(rng.randint(1, 8), OPERATOR_NAMES, rng), rng)
        try:
            sk = sample_skeleton(dag, csp, profile, rng)
            sol = solve(sk, bounds, rng)
        except Conflict:
            continue
        solved += 1
        assert check(sk, bounds, sol.values, sol.flops_floor)
        assert sol.flops <= bounds.flops_max
    assert solved >= 20


def test_hints_differ_by_seed_and_are_usually_feasible() -> None:
    rng = random.Random(1)
    dag, csp = wire(["matmul", "relu", "conv2d", "sum"], rng)
    sk = sample_skeleton(dag, csp, TINY, rng)
    bounds = Bounds.of(TINY)
    hints = [tuple(propose(sk, bounds, random.Random(s), 2**14)) for s in range(10)]
    assert len(set(hints)) >= 5
    assert sum(check(sk, bounds, h, 1) for h in hints) >= 5
