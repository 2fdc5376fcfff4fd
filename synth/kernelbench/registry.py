"""ATen calls onto the operators of `synth.operators`, printed as the registry prints them.

An ATen operator is a registry operator when its name is the operator's name or one of
the operator's `aten` names. Its call fits when the first `arity` schema arguments are
the operator's tensors (a Python number only where the registry's `Call.numbers` allows
one) and every other argument is one of the `Call.params` or sits at its schema default.
The line is the operator's canonical `render` when the parameters that rendering
implies (its constant arguments, else the call's defaults) are the ATen call's;
otherwise the call is spelled through `Call` (name, tensors, the parameters that differ
from their defaults, suffix), which the functional format also allows
(`F.leaky_relu(x, negative_slope=0.2)`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.fx import Node

from synth.kernelbench.fragments import AtenCall, same
from synth.kernelbench.program import Value, literal
from synth.operators import REGISTRY, Operator
from synth.operators.call import REQUIRED

IGNORED_ARGS = frozenset({"cudnn_enabled", "cudnn_enable"})
"""ATen arguments that choose an implementation, not a result."""

WINDOW_PARAMS = frozenset({"kernel_size", "stride", "padding", "dilation", "output_padding"})
DIM_PARAMS = frozenset({"dim", "dim0", "dim1"})


def operator_for(packet: str) -> Operator | None:
    """The registry operator an ATen operator (by packet name) computes, if any."""
    if packet in REGISTRY:
        return REGISTRY[packet]
    for op in REGISTRY.values():
        if packet in op.aten:
            return op
    return None


def normalise(params: Mapping[str, Any], rank: int | None = None) -> dict[str, Any]:
    """Parameters in one form: a one-element dim list as its element, a window size equal
    in every dim as one int, a pooling stride left out as the kernel size; with `rank`,
    dims also non-negative (for comparing, not printing: stack's dim counts the output's
    rank)."""
    out = dict(params)
    for name in DIM_PARAMS & out.keys():
        value = out[name]
        if isinstance(value, list | tuple) and len(value) == 1:
            value = value[0]
        if rank and isinstance(value, int) and not isinstance(value, bool):
            value = value % rank
        out[name] = value
    for name in WINDOW_PARAMS & out.keys():
        value = out[name]
        if isinstance(value, list | tuple) and value and all(v == value[0] for v in value):
            out[name] = value[0]
    if "stride" in out and out["stride"] in (None, [], ()) and "kernel_size" in out:
        out["stride"] = out["kernel_size"]
    return out


def _implied(expr: str, op: Operator) -> dict[str, Any] | None:
    """The parameter values a rendered line states: constant keywords, and constant
    positional arguments after the tensors, by the call's parameter order."""
    spec = op.call
    node = ast.parse(expr, mode="eval").body
    if isinstance(node, ast.Attribute):  # `.values`
        node = node.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "float"
        and isinstance(node.func.value, ast.Call)
    ):  # `.float()`
        node = node.func.value
    if not isinstance(node, ast.Call):
        return None
    stated: dict[str, Any] = {}
    skip = 1 if spec.tensor_list else len(spec.tensors)
    names = list(spec.param_names)
    for position, arg in enumerate(node.args[skip:]):
        if position < len(names):
            try:
                stated[names[position]] = ast.literal_eval(arg)
            except ValueError:
                continue  # an expression (batch_norm's inline statistics)
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            stated[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            continue
    return stated


def canonical(
    op: Operator,
    operands: Sequence[str],
    shapes: Sequence[Sequence[int]],
    params: Mapping[str, Any],
) -> str | None:
    """The operator's own rendering, if it states exactly `params` (others at default)."""
    spec = op.call
    if spec is None:
        return None
    defaults = dict(spec.params)
    rank = len(shapes[0]) if shapes else 0
    render_params = {
        k: v for k, v in normalise({**defaults, **params}).items() if v is not REQUIRED
    }
    if "normalized_shape" in render_params:  # the generator draws layer_norm's dim count
        render_params["k"] = len(render_params["normalized_shape"])
    try:
        expr = op.render(list(operands), render_params, [list(s) for s in shapes])
        stated = _implied(expr, op)
    except (KeyError, IndexError, ValueError, TypeError, SyntaxError):
        return None
    if stated is None:
        return None
    wanted = normalise({**defaults, **params}, rank)
    implied = normalise({**defaults, **stated}, rank)
    if all(same(wanted[name], implied.get(name)) for name in spec.param_names):
        return expr
    return None


def spelled(op: Operator, operands: Sequence[str], params: Mapping[str, Any]) -> str | None:
    """The call written out through the registry's `Call`: name, tensors, the parameters
    that differ from their defaults, suffix."""
    spec = op.call
    if spec is None:
        return None
    tensors = f"[{', '.join(operands)}]" if spec.tensor_list else ", ".join(operands)
    wanted = normalise(params)
    keywords = []
    for name, default in spec.params:
        value = wanted.get(name, default)
        if value is REQUIRED:
            return None
        if default is not REQUIRED and same(value, default):
            continue
        try:
            keywords.append(f"{name}={literal(value)}")
        except Exception:  # noqa: BLE001 - a value with no source form
            return None
    arguments = ", ".join([tensors, *keywords])
    return f"{spec.name}({arguments}){spec.suffix or ''}"


def registry_line(
    call: AtenCall, value_of: Callable[[Node], Value], op: Operator | None = None
) -> tuple[Operator, str] | None:
    """The ATen call as a line applying a registry operator, or None if it is not one."""
    op = op or operator_for(call.packet)
    spec = op.call if op is not None else None
    if op is None or spec is None:
        return None
    schema = call.schema_args
    if spec.tensor_list:
        first = call.args[schema[0].name]
        if not isinstance(first, list | tuple) or len(first) != op.arity:
            return None
        operand_args, rest = list(first), schema[1:]
    else:
        operand_args, rest = [call.args[a.name] for a in schema[: op.arity]], schema[op.arity :]
    operands: list[str] = []
    shapes: list[tuple[int, ...]] = []
    for position, arg in enumerate(operand_args):
        if isinstance(arg, Node):
            value = value_of(arg)
            example = value.example
            if not isinstance(example, torch.Tensor) or example.dtype != torch.float32:
                return None
            operands.append(value.ref)
            shapes.append(tuple(example.shape))
        elif isinstance(arg, int | float) and not isinstance(arg, bool):
            name = spec.tensors[min(position, len(spec.tensors) - 1)]
            if name not in spec.numbers:
                return None
            operands.append(literal(arg))
            shapes.append(())
        else:
            return None
    declared = set(spec.param_names)
    params: dict[str, Any] = {}
    for arg in rest:
        value = call.args[arg.name]
        if arg.name in declared:
            params[arg.name] = value
        elif arg.name in IGNORED_ARGS:
            continue
        elif not (arg.has_default_value() and same(value, arg.default_value)):
            return None
    if any(_holds_node(v) for v in params.values()):
        return None  # tensor-valued parameters (biases, statistics) are split off before
    expr = canonical(op, operands, shapes, params) or spelled(op, operands, params)
    return (op, expr) if expr is not None else None


def _holds_node(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return any(_holds_node(v) for v in value)
    return isinstance(value, Node)
