"""Validation rejects what a verifier could not use: errors, NaN/Inf, wrong shapes and
degenerate outputs (constant, below tolerance, blind to an input)."""

from __future__ import annotations

from synth.program import Op, Program
from synth.validate import check_meta_shapes, check_values


def prog(shapes, n_inputs, nodes) -> Program:
    return Program(tuple(tuple(s) for s in shapes), n_inputs, tuple(Op(*n) for n in nodes))


def reason(program: Program) -> str | None:
    bad = check_values(program, seed=0)
    return bad.reason if bad else None


def test_a_healthy_program_passes() -> None:
    p = prog(
        [[8, 16], [16, 4], [8, 4], [8, 4]], 2, [("matmul", (0, 1), 2, {}), ("relu", (2,), 3, {})]
    )
    assert reason(p) is None
    assert check_meta_shapes(p) is None


def test_wrong_solver_shapes_are_caught() -> None:
    p = prog([[8, 16], [16, 4], [8, 5]], 2, [("matmul", (0, 1), 2, {})])
    assert "solver says [8, 5]" in reason(p)
    assert "solver says [8, 5]" in check_meta_shapes(p).reason


def test_errors_are_caught() -> None:
    p = prog([[8, 16], [15, 4], [8, 4]], 2, [("matmul", (0, 1), 2, {})])
    assert reason(p).startswith("run failed")
    assert check_meta_shapes(p).reason.startswith("meta run failed")


def test_non_finite_values() -> None:
    # x / (x - x) = inf
    p = prog([[32], [32], [32]], 1, [("sub", (0, 0), 1, {}), ("div", (0, 1), 2, {})])
    assert "non-finite" in reason(p)


def test_output_below_tolerance() -> None:
    p = prog([[32], [32]], 1, [("sub", (0, 0), 1, {})])
    assert "below tolerance" in reason(p)


def test_nearly_constant_output() -> None:
    # softmax over an axis of length 1 is the constant 1
    p = prog([[6, 1], [6, 1]], 1, [("softmax", (0,), 1, {"dim": 1})])
    assert "nearly constant" in reason(p)


def test_output_blind_to_an_input() -> None:
    # argmax over a length-1 axis is always 0: tensor_1 never matters
    p = prog(
        [[16], [1], [1], [16]],
        2,
        [("argmax", (1,), 2, {"dim": 0, "keepdim": True}), ("add", (0, 2), 3, {})],
    )
    assert reason(p) == "outputs insensitive to input 1"


def test_huge_values() -> None:
    # exp2(exp2(exp2(x))) overflows to inf or beyond the magnitude bound
    p = prog(
        [[64], [64], [64], [64]],
        1,
        [("exp2", (0,), 1, {}), ("exp2", (1,), 2, {}), ("exp2", (2,), 3, {})],
    )
    r = reason(p)
    assert "non-finite" in r or "values above" in r
