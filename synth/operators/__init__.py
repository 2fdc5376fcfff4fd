"""The operator registry: every operator the generator can place, by name.

`REGISTRY` maps the 61 names of the design (in its table order) to their `Operator`
entries. Adding an operator means adding one entry to a group module (or a new module
listed in `_GROUPS`) plus its test; nothing else in the generator names operators.
"""

from __future__ import annotations

from synth.operators import layout, linalg, norm, pointwise, reduce, window
from synth.operators.base import Operator, ParamContext, Params, numel

_GROUPS = (pointwise, linalg, reduce, layout, norm, window)

_ORDER = (
    "add",
    "sub",
    "mul",
    "div",
    "maximum",
    "minimum",
    "lerp",
    "matmul",
    "bmm",
    "sum",
    "mean",
    "max",
    "min",
    "argmax",
    "argmin",
    "var",
    "norm",
    "transpose",
    "cat",
    "stack",
    "triu",
    "tril",
    "relu",
    "leaky_relu",
    "sigmoid",
    "tanh",
    "softmax",
    "log_softmax",
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
    "cumsum",
    "cummax",
    "cummin",
    "batch_norm",
    "layer_norm",
    "group_norm",
    "instance_norm",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
)


def _build() -> dict[str, Operator]:
    found = {op.name: op for group in _GROUPS for op in group.OPERATORS}
    ordered = {name: found.pop(name) for name in _ORDER if name in found}
    ordered.update(found)  # operators added later keep their module order
    return ordered


REGISTRY: dict[str, Operator] = _build()
"""Operator name -> entry, in the design's order."""

OPERATOR_NAMES: tuple[str, ...] = tuple(REGISTRY)

__all__ = ["OPERATOR_NAMES", "REGISTRY", "Operator", "ParamContext", "Params", "numel"]
