"""The composition DP against brute force on random fragment tables."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.search.compose import Choice, Composition, SpanCost, best_composition, segments

Table = dict[tuple[int, int], SpanCost]


def _compositions(n: int, table: Table, start: int = 0) -> Iterator[list[tuple[int, int, bool]]]:
    """Every way to cover [start, n) with the table's spans and options."""
    if start == n:
        yield []
        return
    for (a, b), cost in table.items():
        if a != start:
            continue
        for converted, value in ((True, cost.converted), (False, cost.pytorch)):
            if value is None:
                continue
            for rest in _compositions(n, table, b):
                yield [(a, b, converted), *rest]


def _cost(table: Table, parts: list[tuple[int, int, bool]]) -> float:
    total = 0.0
    for a, b, converted in parts:
        value = table[(a, b)].converted if converted else table[(a, b)].pytorch
        assert value is not None
        total += value
    return total


def _brute_force(n: int, table: Table, require_converted: bool) -> float | None:
    costs = [
        _cost(table, parts)
        for parts in _compositions(n, table)
        if not require_converted or any(c for _, _, c in parts)
    ]
    return min(costs) if costs else None


def _assert_valid(n: int, table: Table, found: Composition, require_converted: bool) -> None:
    position = 0
    for choice in found.choices:
        assert choice.start == position and choice.stop > choice.start
        option = table[(choice.start, choice.stop)]
        assert (option.converted if choice.converted else option.pytorch) == choice.cost
        position = choice.stop
    assert position == n
    assert math.isclose(found.cost, sum(c.cost for c in found.choices), abs_tol=1e-9)
    assert not require_converted or found.converted


@st.composite
def tables(draw: st.DrawFn) -> tuple[int, Table]:
    n = draw(st.integers(1, 8))
    max_span = draw(st.integers(1, 5))
    cost = st.one_of(st.none(), st.floats(0.0, 100.0, allow_nan=False))
    table: Table = {}
    for start in range(n):
        for stop in range(start + 1, min(n, start + max_span) + 1):
            if draw(st.booleans()) or stop == start + 1:
                table[(start, stop)] = SpanCost(converted=draw(cost), pytorch=draw(cost))
    return n, table


@settings(max_examples=300, deadline=None)
@given(tables(), st.booleans())
def test_dp_matches_brute_force(case: tuple[int, Table], require_converted: bool) -> None:
    n, table = case
    expected = _brute_force(n, table, require_converted)
    found = best_composition(n, table, require_converted=require_converted)
    if expected is None:
        assert found is None
        return
    assert found is not None
    _assert_valid(n, table, found, require_converted)
    assert math.isclose(found.cost, expected, rel_tol=1e-9, abs_tol=1e-9)


def test_fastest_composition_mixes_kernels_and_pytorch() -> None:
    table = {
        (0, 1): SpanCost(converted=5.0, pytorch=2.0),
        (1, 2): SpanCost(converted=None, pytorch=2.0),
        (2, 3): SpanCost(converted=1.0, pytorch=2.0),
        (0, 2): SpanCost(converted=3.5, pytorch=None),
        (1, 3): SpanCost(converted=3.0, pytorch=None),
    }
    found = best_composition(3, table)
    assert found is not None
    assert [(c.start, c.stop, c.converted) for c in found.choices] == [
        (0, 2, True),
        (2, 3, True),
    ]
    assert found.cost == pytest.approx(4.5) and found.converted_ops == 3


def test_a_slower_kernel_is_still_used_when_one_must_be() -> None:
    table = {(0, 1): SpanCost(converted=9.0, pytorch=1.0), (1, 2): SpanCost(pytorch=1.0)}
    chosen = best_composition(2, table)
    assert chosen is not None and chosen.cost == 10.0
    plain = best_composition(2, table, require_converted=False)
    assert plain is not None and plain.cost == 2.0 and not plain.converted
    assert (
        best_composition(2, {(0, 1): SpanCost(pytorch=1.0), (1, 2): SpanCost(pytorch=1.0)}) is None
    )


def test_ties_go_to_fewer_fragments() -> None:
    table = {
        (0, 1): SpanCost(converted=1.0),
        (1, 2): SpanCost(converted=1.0),
        (0, 2): SpanCost(converted=2.0),
    }
    found = best_composition(2, table)
    assert found is not None and [(c.start, c.stop) for c in found.choices] == [(0, 2)]


def test_bad_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        best_composition(2, {(1, 3): SpanCost(pytorch=1.0)})
    with pytest.raises(ValueError, match="non-negative"):
        best_composition(1, {(0, 1): SpanCost(pytorch=-1.0)})
    with pytest.raises(ValueError, match="at least one step"):
        best_composition(0, {})


def test_segments_are_maximal_runs_of_converted_spans() -> None:
    choices = (
        Choice(0, 2, True, 1.0),
        Choice(2, 3, True, 1.0),
        Choice(3, 4, False, 1.0),
        Choice(4, 6, True, 1.0),
    )
    runs = segments(Composition(choices, 4.0))
    assert [[(c.start, c.stop) for c in run] for run in runs] == [[(0, 2), (2, 3)], [(4, 6)]]
