"""Layout operators: transpose of the last two dims, cat, stack, triu, tril."""

from __future__ import annotations

from collections.abc import Iterable

from synth.dims import Atom, DimSystem
from synth.operators.base import (
    Operator,
    ParamContext,
    Params,
    elementwise_flops,
    pick_dim,
    same_rank,
    template,
)
from synth.operators.call import REQUIRED, Call, min_rank


def _transpose_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    (x,) = ins
    return [*x[:-2], x[-1], x[-2]]


def _cat_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    a, b = ins
    d = params["dim"]
    for i, (da, db) in enumerate(zip(a, b, strict=True)):
        if i != d:
            m.unify(da, db)
    return [*a[:d], m.add(a[d], b[d]), *a[d + 1 :]]


def _stack_rank(ins: tuple[int, ...]) -> Iterable[tuple[int, Params]]:
    if ins[0] == ins[1]:
        yield ins[0] + 1, {}


def _stack_params(ctx: ParamContext) -> Params:
    return {"dim": ctx.rng.randint(0, ctx.in_ranks[0])}


def _stack_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    a, b = ins
    for da, db in zip(a, b, strict=True):
        m.unify(da, db)
    d = params["dim"]
    return [*a[:d], m.const(2), *a[d:]]


def _same_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    return list(ins[0])


OPERATORS: list[Operator] = [
    Operator(
        name="transpose",
        group="layout",
        arity=1,
        rank_rule=same_rank(lo=2),
        shape=_transpose_shape,
        flops=elementwise_flops(1),
        render=template("torch.transpose({0}, -2, -1)"),
        call=Call(
            ("torch.transpose",), params=(("dim0", REQUIRED), ("dim1", REQUIRED)), ranks=min_rank(2)
        ),
    ),
    Operator(
        name="cat",
        group="layout",
        arity=2,
        rank_rule=same_rank(lo=1),
        sample_params=pick_dim,
        shape=_cat_shape,
        flops=elementwise_flops(1),
        render=template("torch.cat([{0}, {1}], dim={dim})"),
        call=Call(
            ("torch.cat", "torch.concat"),
            tensors=("tensors",),
            params=(("dim", 0),),
            tensor_list=True,
            ranks=min_rank(1, 2),
            same_rank=True,
        ),
    ),
    Operator(
        name="stack",
        group="layout",
        arity=2,
        rank_rule=_stack_rank,
        sample_params=_stack_params,
        shape=_stack_shape,
        flops=elementwise_flops(1),
        render=template("torch.stack([{0}, {1}], dim={dim})"),
        call=Call(
            ("torch.stack",),
            tensors=("tensors",),
            params=(("dim", 0),),
            tensor_list=True,
            same_rank=True,
        ),
    ),
    Operator(
        name="triu",
        group="layout",
        arity=1,
        rank_rule=same_rank(lo=2),
        shape=_same_shape,
        flops=elementwise_flops(1),
        render=template("torch.triu({0})"),
        call=Call(("torch.triu",), params=(("diagonal", 0),), ranks=min_rank(2)),
    ),
    Operator(
        name="tril",
        group="layout",
        arity=1,
        rank_rule=same_rank(lo=2),
        shape=_same_shape,
        flops=elementwise_flops(1),
        render=template("torch.tril({0})"),
        call=Call(("torch.tril",), params=(("diagonal", 0),), ranks=min_rank(2)),
    ),
]
