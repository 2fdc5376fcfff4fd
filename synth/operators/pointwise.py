"""Elementwise operators: broadcasting binaries, lerp, activations, unary math."""

from __future__ import annotations

from typing import Any

from synth.dims import Atom, DimSystem
from synth.operators.base import (
    Operator,
    Params,
    broadcast_dims,
    broadcast_params,
    broadcast_rank,
    elementwise_flops,
    same_rank,
    template,
)
from synth.operators.call import Call


def _broadcast_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    return broadcast_dims(m, ins, params.get("_broadcast"))


def _same_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    return list(ins[0])


def binary(
    name: str,
    call: str,
    tensors: tuple[str, ...] = ("input", "other"),
    coef: int = 1,
    numbers: tuple[str, ...] = (),
    params: tuple[tuple[str, Any], ...] = (),
) -> Operator:
    """A broadcasting elementwise operator printed as `call(a, b, ...)`; `numbers` are
    the tensor arguments a program may write as a Python number, `params` the call's
    other parameters with their defaults (never printed by the generator)."""
    arity = len(tensors)
    args = ", ".join(f"{{{i}}}" for i in range(arity))
    return Operator(
        name=name,
        group="binary",
        arity=arity,
        rank_rule=broadcast_rank(),
        sample_params=broadcast_params,
        shape=_broadcast_shape,
        flops=elementwise_flops(coef),
        render=template(f"{call}({args})"),
        call=Call((call,), tensors=tensors, numbers=numbers, params=params),
    )


def unary(
    name: str,
    fmt: str,
    group: str = "activation",
    aliases: tuple[str, ...] = (),
    params: tuple[tuple[str, Any], ...] = (),
    aten: tuple[str, ...] = (),
) -> Operator:
    """A shape-preserving elementwise operator printed by `fmt` over `{0}`; `aliases` are
    other names of its call, `params` the call's parameters with their defaults, `aten`
    other ATen operators that compute it."""
    return Operator(
        name=name,
        group=group,
        arity=1,
        rank_rule=same_rank(),
        shape=_same_shape,
        flops=elementwise_flops(1),
        render=template(fmt),
        call=Call((fmt[: fmt.index("(")], *aliases), params=params),
        aten=aten,
    )


INPLACE = ("inplace", False)
EITHER = ("input", "other")
ALPHA = (("alpha", 1),)

OPERATORS: list[Operator] = [
    # Either operand may be a Python number (`torch.mul(x, 0.5)`, `torch.sub(1.0, x)`);
    # add and sub scale `other` by `alpha`. maximum and minimum take tensors only.
    binary("add", "torch.add", numbers=EITHER, params=ALPHA),
    binary("sub", "torch.sub", numbers=EITHER, params=ALPHA),
    binary("mul", "torch.mul", numbers=EITHER),
    binary("div", "torch.div", numbers=EITHER),
    binary("maximum", "torch.maximum"),
    binary("minimum", "torch.minimum"),
    binary("lerp", "torch.lerp", ("input", "end", "weight"), coef=2, numbers=("weight",)),
    unary("relu", "torch.relu({0})", aliases=("F.relu",)),
    unary(
        "leaky_relu",
        "F.leaky_relu({0}, negative_slope=0.01)",
        params=(("negative_slope", 0.01), INPLACE),
    ),
    unary("sigmoid", "torch.sigmoid({0})", aliases=("F.sigmoid",)),
    unary("tanh", "torch.tanh({0})", aliases=("F.tanh",)),
    unary("silu", "F.silu({0})", params=(INPLACE,)),
    unary("gelu", "F.gelu({0})", params=(("approximate", "none"),)),
    unary("selu", "torch.selu({0})", aliases=("F.selu",)),
    unary("hardsigmoid", "F.hardsigmoid({0})", params=(INPLACE,)),
    unary("softplus", "F.softplus({0})", params=(("beta", 1.0), ("threshold", 20.0))),
    unary("softsign", "F.softsign({0})"),
    unary("elu", "F.elu({0}, alpha=1.0)", params=(("alpha", 1.0), INPLACE)),
    unary(
        "hardtanh",
        "F.hardtanh({0}, min_val=-1.0, max_val=1.0)",
        params=(("min_val", -1.0), ("max_val", 1.0), INPLACE),
    ),
    unary("clamp", "torch.clamp({0}, min=0.0, max=1.0)", params=(("min", None), ("max", None))),
    unary("logsigmoid", "F.logsigmoid({0})", aten=("log_sigmoid",)),
    unary("cos", "torch.cos({0})", group="math"),
    unary("sin", "torch.sin({0})", group="math"),
    unary("exp2", "torch.exp2({0})", group="math"),
    unary("abs", "torch.abs({0})", group="math"),
]
