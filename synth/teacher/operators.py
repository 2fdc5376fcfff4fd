"""The operators the teacher translates: the registry's entries, each with its template family.

Every fact about an operator (its call names, tensor arguments, parameters and their
defaults, suffix, shape rule) comes from `synth.operators.REGISTRY`. What is the
teacher's own is which template family renders it (`FAMILIES`), plus `copy`, the
planner's copy of a view or an input into fresh memory, which is no PyTorch call.
"""

from __future__ import annotations

from dataclasses import dataclass

from synth.operators import REGISTRY
from synth.operators.call import Call

FAMILIES: dict[str, tuple[str, ...]] = {
    "pointwise": (
        "add",
        "sub",
        "mul",
        "div",
        "maximum",
        "minimum",
        "lerp",
        "triu",
        "tril",
        "relu",
        "leaky_relu",
        "sigmoid",
        "tanh",
        "silu",
        "gelu",
        "selu",
        "hardsigmoid",
        "softplus",
        "softsign",
        "elu",
        "hardtanh",
        "clamp",
        "logsigmoid",
        "cos",
        "sin",
        "exp2",
        "abs",
    ),
    "matmul": ("matmul", "bmm"),
    "reduction": ("sum", "mean", "max", "min", "argmax", "argmin", "var", "norm"),
    "layout": ("transpose", "cat", "stack"),
    "softmax": ("softmax", "log_softmax"),
    "scan": ("cumsum", "cummax", "cummin"),
    "norm": ("batch_norm", "layer_norm", "group_norm", "instance_norm"),
    "pool": tuple(f"{kind}_pool{n}d" for kind in ("avg", "max") for n in (1, 2, 3)),
    "conv": tuple(f"conv{t}{n}d" for t in ("", "_transpose") for n in (1, 2, 3)),
}
"""Template family -> the registry operators it renders."""

COPY = "copy"


@dataclass(frozen=True)
class OperatorSpec:
    """One operator as the teacher sees it: the registry's call and arity, its family."""

    kind: str
    family: str
    call: Call
    arity: int

    @property
    def tensor_args(self) -> tuple[str, ...]:
        """Keyword names of the tensor arguments, as PyTorch spells them."""
        return self.call.tensors


def _specs() -> dict[str, OperatorSpec]:
    family_of = {name: family for family, names in FAMILIES.items() for name in names}
    unknown = set(family_of) - set(REGISTRY)
    if unknown:
        raise ImportError(f"teacher families name operators outside the registry: {unknown}")
    specs = {}
    for name, op in REGISTRY.items():
        if name in family_of and op.call is not None:
            specs[name] = OperatorSpec(name, family_of[name], op.call, op.arity)
    specs[COPY] = OperatorSpec(COPY, "pointwise", Call(names=()), 1)
    return specs


OPERATORS: dict[str, OperatorSpec] = _specs()
"""Operator kind -> spec: the registry's operators that have a template family, and `copy`."""

BY_CALL: dict[str, OperatorSpec] = {
    name: spec for spec in OPERATORS.values() for name in spec.call.names
}
"""Callee name (`torch.relu`, `F.relu`, ...) -> spec."""
