"""Contractions: matmul (batch dims broadcast) and bmm."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synth.dims import Atom, DimSystem
from synth.operators.base import (
    Operator,
    ParamContext,
    Params,
    broadcast_dims,
    broadcast_params,
    broadcast_rank,
    exact_rank,
    template,
)
from synth.operators.call import Call, min_rank


def _matmul_params(ctx: ParamContext) -> Params:
    return broadcast_params(ctx, [r - 2 for r in ctx.in_ranks])


def _matmul_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    a, b = ins
    m.unify(a[-1], b[-2])
    batch = broadcast_dims(m, [a[:-2], b[:-2]], params.get("_broadcast"))
    return [*batch, a[-2], b[-1]]


def _bmm_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    a, b = ins
    m.unify(a[0], b[0])
    m.unify(a[2], b[1])
    return [a[0], a[1], b[2]]


def _contraction_flops(
    ins: Sequence[Sequence[Any]], out: Sequence[Any], params: Params
) -> tuple[int, list[Any]]:
    """2 * |out| * K (one multiply and one add per term)."""
    return 2, [*out, ins[0][-1]]


OPERATORS: list[Operator] = [
    Operator(
        name="matmul",
        group="matmul",
        arity=2,
        rank_rule=broadcast_rank(lo=2),
        sample_params=_matmul_params,
        shape=_matmul_shape,
        flops=_contraction_flops,
        render=template("torch.matmul({0}, {1})"),
        call=Call(("torch.matmul",), tensors=("input", "other"), ranks=min_rank(2, 2)),
        aten=("mm",),
    ),
    Operator(
        name="bmm",
        group="matmul",
        arity=2,
        rank_rule=exact_rank(3),
        shape=_bmm_shape,
        flops=_contraction_flops,
        render=template("torch.bmm({0}, {1})"),
        call=Call(("torch.bmm",), tensors=("input", "mat2"), ranks=((3, 3), (3, 3))),
    ),
]
