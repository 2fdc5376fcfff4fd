"""Elementwise operators: broadcasting binaries, lerp, activations, unary math."""

from __future__ import annotations

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


def _broadcast_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    return broadcast_dims(m, ins, params["_broadcast"])


def _same_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    return list(ins[0])


def binary(name: str, call: str, arity: int = 2, coef: int = 1) -> Operator:
    """A broadcasting elementwise operator printed as `call(a, b, ...)`."""
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
    )


def unary(name: str, fmt: str, group: str = "activation") -> Operator:
    """A shape-preserving elementwise operator printed by `fmt` over `{0}`."""
    return Operator(
        name=name,
        group=group,
        arity=1,
        rank_rule=same_rank(),
        shape=_same_shape,
        flops=elementwise_flops(1),
        render=template(fmt),
    )


OPERATORS: list[Operator] = [
    binary("add", "torch.add"),
    binary("sub", "torch.sub"),
    binary("mul", "torch.mul"),
    binary("div", "torch.div"),
    binary("maximum", "torch.maximum"),
    binary("minimum", "torch.minimum"),
    binary("lerp", "torch.lerp", arity=3, coef=2),
    unary("relu", "torch.relu({0})"),
    unary("leaky_relu", "F.leaky_relu({0}, negative_slope=0.01)"),
    unary("sigmoid", "torch.sigmoid({0})"),
    unary("tanh", "torch.tanh({0})"),
    unary("silu", "F.silu({0})"),
    unary("gelu", "F.gelu({0})"),
    unary("selu", "torch.selu({0})"),
    unary("hardsigmoid", "F.hardsigmoid({0})"),
    unary("softplus", "F.softplus({0})"),
    unary("softsign", "F.softsign({0})"),
    unary("elu", "F.elu({0}, alpha=1.0)"),
    unary("hardtanh", "F.hardtanh({0}, min_val=-1.0, max_val=1.0)"),
    unary("clamp", "torch.clamp({0}, min=0.0, max=1.0)"),
    unary("logsigmoid", "F.logsigmoid({0})"),
    unary("cos", "torch.cos({0})", group="math"),
    unary("sin", "torch.sin({0})", group="math"),
    unary("exp2", "torch.exp2({0})", group="math"),
    unary("abs", "torch.abs({0})", group="math"),
]
