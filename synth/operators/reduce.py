"""Operators along one axis: reductions (dim, keepdim), softmax-likes and scans."""

from __future__ import annotations

from typing import Any

from synth.dims import Atom, DimSystem
from synth.operators.base import (
    Operator,
    Params,
    input_flops,
    pick_dim,
    reduce_rank,
    same_rank,
    template,
)
from synth.operators.call import REQUIRED, Call, min_rank


def _reduce_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    (x,) = ins
    d = params["dim"]
    m.at_least(x[d], 2)  # reducing a size-1 axis is a copy (and var would be NaN)
    kept = [m.ONE] if params["keepdim"] else []
    return [*x[:d], *kept, *x[d + 1 :]]


REDUCE_PARAMS = (("dim", REQUIRED), ("keepdim", False))


def reduction(
    name: str,
    call: str,
    suffix: str = "",
    coef: int = 1,
    params: tuple[tuple[str, Any], ...] = REDUCE_PARAMS,
    aten: tuple[str, ...] = (),
) -> Operator:
    """A reduction along `dim`; `params` are its call's parameters with their defaults,
    `aten` other ATen operators that compute it."""
    return Operator(
        name=name,
        group="reduction",
        arity=1,
        rank_rule=reduce_rank,
        sample_params=pick_dim,
        shape=_reduce_shape,
        flops=input_flops(coef),
        render=template(f"{call}({{0}}, dim={{dim}}, keepdim={{keepdim}}){suffix}"),
        call=Call((call,), params=params, suffix=suffix or None, ranks=min_rank(1)),
        aten=aten,
    )


def _axis_shape(min_size: int):
    def shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
        (x,) = ins
        m.at_least(x[params["dim"]], min_size)
        return list(x)

    return shape


def along_axis(
    name: str,
    call: str,
    group: str,
    suffix: str = "",
    coef: int = 1,
    aliases: tuple[str, ...] = (),
) -> Operator:
    """Shape-preserving op along `dim`. Softmax-likes need the axis longer than 1 (on one
    element softmax is the constant 1 and log_softmax the constant 0)."""
    return Operator(
        name=name,
        group=group,
        arity=1,
        rank_rule=same_rank(lo=1),
        sample_params=pick_dim,
        shape=_axis_shape(2 if group == "activation" else 1),
        flops=input_flops(coef),
        render=template(f"{call}({{0}}, dim={{dim}}){suffix}"),
        call=Call(
            (call, *aliases),
            params=(("dim", REQUIRED),),
            suffix=suffix or None,
            ranks=min_rank(1),
        ),
    )


OPERATORS: list[Operator] = [
    reduction("sum", "torch.sum"),
    reduction("mean", "torch.mean"),
    reduction("max", "torch.max", ".values", aten=("amax",)),
    reduction("min", "torch.min", ".values", aten=("amin",)),
    reduction("argmax", "torch.argmax", ".float()"),
    reduction("argmin", "torch.argmin", ".float()"),
    reduction(
        "var",
        "torch.var",
        coef=3,
        params=(("dim", REQUIRED), ("unbiased", True), ("keepdim", False), ("correction", None)),
    ),
    reduction(
        "norm",
        "torch.norm",
        coef=3,
        params=(("p", "fro"), ("dim", REQUIRED), ("keepdim", False)),
        aten=("linalg_vector_norm",),
    ),
    along_axis("softmax", "torch.softmax", "activation", coef=3, aliases=("F.softmax",)),
    along_axis(
        "log_softmax", "torch.log_softmax", "activation", coef=3, aliases=("F.log_softmax",)
    ),
    along_axis("cumsum", "torch.cumsum", "scan"),
    along_axis("cummax", "torch.cummax", "scan", ".values"),
    along_axis("cummin", "torch.cummin", "scan", ".values"),
]
