"""Normalisation: batch_norm (training statistics), layer_norm, group_norm, instance_norm.

Each normalises over a set of elements that must hold more than one value, or the
output is the constant 0 (or PyTorch refuses: batch_norm in training mode, instance_norm).
The shape rule therefore forces one axis of that set (drawn as a parameter) to be >= 2.
"""

from __future__ import annotations

from collections.abc import Sequence

from synth.dims import Atom, DimSystem
from synth.operators.base import (
    Operator,
    ParamContext,
    Params,
    input_flops,
    pick_axis,
    pick_divisor,
    same_rank,
    template,
)
from synth.operators.call import REQUIRED, Call, min_rank

NORM_FLOPS = 5
"""Per element: mean, variance, subtract, divide, (scale)."""


def _keep(m: DimSystem, x: list[Atom], axis: int | None) -> list[Atom]:
    """`x` unchanged, `axis` (the drawn `_nonunit`, absent from a given program) >= 2."""
    if axis is not None:
        m.at_least(x[axis], 2)
    return list(x)


# batch_norm: statistics per channel (dim 1) over batch and spatial dims.
def _bn_params(ctx: ParamContext) -> Params:
    r = ctx.in_ranks[0]
    return {"_nonunit": pick_axis(ctx, [0, *range(2, r)])}


def _bn_render(args: Sequence[str], params: Params, in_shapes: Sequence[Sequence[int]]) -> str:
    x, c = args[0], in_shapes[0][1]
    return (
        f"F.batch_norm({x}, torch.zeros({c}, device={x}.device), "
        f"torch.ones({c}, device={x}.device), training=True)"
    )


# layer_norm over the last k dims.
def _ln_params(ctx: ParamContext) -> Params:
    r = ctx.in_ranks[0]
    k = ctx.rng.randint(2, min(4, r))
    return {"k": k, "_nonunit": pick_axis(ctx, range(r - k, r))}


def _ln_render(args: Sequence[str], params: Params, in_shapes: Sequence[Sequence[int]]) -> str:
    dims = ", ".join(str(d) for d in in_shapes[0][-params["k"] :])
    return f"F.layer_norm({args[0]}, normalized_shape=[{dims}])"


# group_norm: G groups of C/G channels, statistics over channels-in-group and spatial dims.
def _gn_params(ctx: ParamContext) -> Params:
    r = ctx.in_ranks[0]
    groups = pick_divisor(ctx, ctx.profile.norm_groups, ctx.fixed_dim(0, 1))
    return {"num_groups": groups, "_nonunit": pick_axis(ctx, [1, *range(2, r)])}


def _gn_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    (x,) = ins
    per_group = m.split(x[1], params["num_groups"])
    nonunit = params.get("_nonunit")
    if nonunit == 1:
        m.at_least(per_group, 2)
    elif nonunit is not None:
        m.at_least(x[nonunit], 2)
    return list(x)


# instance_norm: statistics per (batch, channel) over spatial dims.
def _in_params(ctx: ParamContext) -> Params:
    return {"_nonunit": pick_axis(ctx, range(2, ctx.in_ranks[0]))}


def _nonunit_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    return _keep(m, ins[0], params.get("_nonunit"))


OPERATORS: list[Operator] = [
    Operator(
        name="batch_norm",
        group="normalization",
        arity=1,
        rank_rule=same_rank(2, 5),
        sample_params=_bn_params,
        shape=_nonunit_shape,
        flops=input_flops(NORM_FLOPS),
        render=_bn_render,
        call=Call(
            ("F.batch_norm",),
            params=(
                ("running_mean", REQUIRED),
                ("running_var", REQUIRED),
                ("weight", None),
                ("bias", None),
                ("training", False),
                ("momentum", 0.1),
                ("eps", 1e-5),
            ),
            ranks=min_rank(2),
        ),
    ),
    Operator(
        name="layer_norm",
        group="normalization",
        arity=1,
        rank_rule=same_rank(2, 5),
        sample_params=_ln_params,
        shape=_nonunit_shape,
        flops=input_flops(NORM_FLOPS),
        render=_ln_render,
        call=Call(
            ("F.layer_norm",),
            params=(
                ("normalized_shape", REQUIRED),
                ("weight", None),
                ("bias", None),
                ("eps", 1e-5),
            ),
            ranks=min_rank(1),
        ),
    ),
    Operator(
        name="group_norm",
        group="normalization",
        arity=1,
        rank_rule=same_rank(3, 5),
        sample_params=_gn_params,
        shape=_gn_shape,
        flops=input_flops(NORM_FLOPS),
        render=template("F.group_norm({0}, num_groups={num_groups})"),
        call=Call(
            ("F.group_norm",),
            params=(("num_groups", REQUIRED), ("weight", None), ("bias", None), ("eps", 1e-5)),
            ranks=min_rank(2),
        ),
    ),
    Operator(
        name="instance_norm",
        group="normalization",
        arity=1,
        rank_rule=same_rank(3, 5),
        sample_params=_in_params,
        shape=_nonunit_shape,
        flops=input_flops(NORM_FLOPS),
        render=template("F.instance_norm({0})"),
        call=Call(
            ("F.instance_norm",),
            params=(
                ("running_mean", None),
                ("running_var", None),
                ("weight", None),
                ("bias", None),
                ("use_input_stats", True),
                ("momentum", 0.1),
                ("eps", 1e-5),
            ),
            ranks=min_rank(3),
        ),
    ),
]
