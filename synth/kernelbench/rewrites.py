"""Composite ATen operators rewritten into the registry's operators.

`torch.export` keeps composite operators (linear, conv with bias, affine norms) as one
call; the registry has their parts. Each rewrite writes the parts as registry lines
and raises `Decline` when its pattern does not apply, so the caller tries the next way
(the call as one registry operator, then as plain PyTorch). Broadcasting a per-channel
parameter over the spatial dims needs a reshape, kept as a PyTorch line; it reads
parameters only, so the program puts it ahead of the operators that do the work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import Node

from synth.kernelbench.fragments import AtenCall, bind, same
from synth.kernelbench.program import Value, literal
from synth.kernelbench.registry import canonical, operator_for, spelled
from synth.operators import REGISTRY
from synth.operators.call import is_number

if TYPE_CHECKING:
    from synth.kernelbench.lower import Lowering


class Decline(Exception):
    """This way of writing the call does not apply."""


class RandomOperator(Exception):
    """The call draws random numbers: the Model is not deterministic."""


DROPOUTS = frozenset(
    {"dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}
)


def refuse_random(call: AtenCall) -> None:
    """Raise `RandomOperator` for a random call (dropout that drops nothing is not)."""
    if torch.Tag.nondeterministic_seeded not in call.target.tags:
        return
    if call.packet in DROPOUTS and (same(call.args.get("p"), 0) or call.args.get("train") is False):
        return
    hint = " (dropout is random in training mode: use p=0)" if call.packet in DROPOUTS else ""
    raise RandomOperator(
        f"{call.label} draws random numbers, so the Model is not deterministic{hint}"
    )


def registry_op(
    lw: Lowering, name: str, operands: Sequence[Value], params: dict[str, Any]
) -> Value:
    """A line applying the registry operator `name` as the registry renders it."""
    op = REGISTRY[name]
    shapes = [tuple(v.example.shape) for v in operands]
    expr = canonical(op, [v.ref for v in operands], shapes, params)
    if expr is None:
        raise Decline(f"{name} with {params} is not the registry's rendering")
    return lw.line(expr, name, mapped=True)


def channel_view(lw: Lowering, param: Value, spatial_dims: int) -> Value:
    """A per-channel parameter `[C]` as `[C, 1, ...]`, to broadcast over spatial dims:
    a Model parameter enters the program in that shape; anything else is reshaped."""
    if spatial_dims <= 0:
        return param
    shape = [int(param.example.numel())] + [1] * spatial_dims
    folded = lw.reshaped_input(param, shape)
    if folded is not None:
        return folded
    return lw.line(f"torch.reshape({param.ref}, {literal(shape)})", "aten.reshape", mapped=False)


def _affine(lw: Lowering, y: Value, weight: Any, bias: Any, spatial_dims: int) -> Value:
    if weight is not None:
        y = registry_op(lw, "mul", [y, channel_view(lw, lw.value(weight), spatial_dims)], {})
    if bias is not None:
        y = registry_op(lw, "add", [y, channel_view(lw, lw.value(bias), spatial_dims)], {})
    return y


def _first(call: AtenCall) -> Any:
    return call.args[call.schema_args[0].name]


# -- the rewrites --------------------------------------------------------------------------
def identity(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """Copies, aliases, dropout that drops nothing, casts to the same dtype."""
    if index not in (None, 0):
        raise Decline("not the tensor itself")
    source = _first(call)
    if not isinstance(source, Node):
        raise Decline("not a tensor")
    value = lw.value(source)
    if call.packet == "_to_copy":
        dtype = call.args.get("dtype")
        if dtype not in (None, value.example.dtype) or call.args.get("layout") not in (
            None,
            torch.strided,
        ):
            raise Decline("a real conversion")
    return value


def cast_indices(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """`argmax(...).float()` (argmax/argmin, then a cast to float32) is the registry's
    argmax; any other cast is not rewritten."""
    source = _first(call)
    if call.args.get("dtype") != torch.float32 or not isinstance(source, Node):
        return identity(lw, call, index)
    inner = bind(source)
    if inner.packet not in ("argmax", "argmin") or inner.args.get("dim") is None:
        return identity(lw, call, index)
    x = lw.value(inner.args["self"])
    return registry_op(
        lw, inner.packet, [x], {"dim": inner.args["dim"], "keepdim": inner.args["keepdim"]}
    )


def softsign(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """x / (1 + |x|), as `F.softsign` traces, is the registry's softsign."""
    x, denominator = call.args["self"], call.args["other"]
    if not isinstance(denominator, Node) or not isinstance(x, Node):
        raise Decline("not softsign")
    plus = bind(denominator)
    if plus.packet != "add" or not same(plus.args.get("alpha"), 1):
        raise Decline("not softsign")
    terms = [plus.args["self"], plus.args["other"]]
    absolute = next((t for t in terms if isinstance(t, Node)), None)
    one = next((t for t in terms if not isinstance(t, Node)), None)
    if absolute is None or not same(one, 1) or bind(absolute).packet != "abs":
        raise Decline("not softsign")
    if bind(absolute).args["self"] is not x or call.target._overloadname != "Tensor":
        raise Decline("not softsign")
    return registry_op(lw, "softsign", [lw.value(x)], {})


def linear(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """x @ W^T + b as transpose, matmul, add."""
    weight = lw.value(call.args["weight"])
    if weight.example.dim() != 2:
        raise Decline("weight is not a matrix")
    transposed = registry_op(lw, "transpose", [weight], {"dim0": -2, "dim1": -1})
    y = registry_op(lw, "matmul", [lw.value(call.args["input"]), transposed], {})
    if call.args["bias"] is not None:
        y = registry_op(lw, "add", [y, lw.value(call.args["bias"])], {})
    return y


def addmm(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """bias + a @ b as matmul, add (unit alpha and beta only)."""
    if not (same(call.args["beta"], 1) and same(call.args["alpha"], 1)):
        raise Decline("scaled addmm")
    operands = [lw.value(call.args["mat1"]), lw.value(call.args["mat2"])]
    y = registry_op(lw, "matmul", operands, {})
    return registry_op(lw, "add", [y, lw.value(call.args["self"])], {})


def conv_bias(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """A convolution with bias as the convolution without it, then an add."""
    bias = call.args.get("bias")
    if bias is None:
        raise Decline("no bias")
    y = lw.registry(replace(call, args={**call.args, "bias": None}))
    spatial = int(call.packet[-2])
    return registry_op(lw, "add", [y, channel_view(lw, lw.value(bias), spatial)], {})


def layer_norm(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    weight, bias = call.args["weight"], call.args["bias"]
    if weight is None and bias is None:
        raise Decline("no affine weights")
    y = lw.registry(replace(call, args={**call.args, "weight": None, "bias": None}))
    return _affine(lw, y, weight, bias, 0)


def channel_norm(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """group_norm / instance_norm with per-channel affine weights."""
    weight, bias = call.args["weight"], call.args["bias"]
    if weight is None and bias is None:
        raise Decline("no affine weights")
    if call.packet == "instance_norm" and (
        call.args["running_mean"] is not None or not call.args["use_input_stats"]
    ):
        raise Decline("instance norm with running statistics")
    y = lw.registry(replace(call, args={**call.args, "weight": None, "bias": None}))
    return _affine(lw, y, weight, bias, y.example.dim() - 2)


def batch_norm(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """Batch norm on batch statistics (training mode) as the registry's batch_norm plus
    its affine weights; the running-statistics updates are not outputs."""
    if index not in (None, 0) or not call.args.get("training", False):
        raise Decline("not the normalised output in training mode")
    x = lw.value(call.args["input"])
    y = registry_op(lw, "batch_norm", [x], {"training": True, "eps": call.args["eps"]})
    return _affine(lw, y, call.args["weight"], call.args["bias"], x.example.dim() - 2)


def reduce_dims(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """A reduction over several dims (or all) as one registry reduction per dim, the
    highest first, so the dims still to reduce keep their positions."""
    op = operator_for(call.packet)
    if op is None or index is not None:
        raise Decline("not a plain reduction")
    if call.packet in ("max", "min") and call.target._overloadname != "default":
        raise Decline("max/min of two tensors, or along one dim with indices")
    if call.args.get("dtype") is not None:
        raise Decline("reduction with a dtype")
    if call.packet == "linalg_vector_norm" and not same(call.args["ord"], 2):
        raise Decline("not the 2-norm")
    y = lw.value(_first(call))
    rank = y.example.dim()
    dims = call.args.get("dim")
    if rank == 0:
        raise Decline("rank-0 input")
    if dims is None or (isinstance(dims, list | tuple) and not dims):
        dims = list(range(rank))
    elif isinstance(dims, int):
        dims = [dims]
    keepdim = bool(call.args.get("keepdim", False))
    for dim in sorted({d % rank for d in dims}, reverse=True):
        y = registry_op(lw, op.name, [y], {"dim": dim, "keepdim": keepdim})
    return y


def cat(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """cat of more than two tensors as a chain of two-tensor cats."""
    tensors = call.args["tensors"]
    if len(tensors) == 1:
        return lw.value(tensors[0])
    if len(tensors) == 2:
        raise Decline("the registry's cat")
    y = lw.value(tensors[0])
    for other in tensors[1:]:
        y = registry_op(lw, "cat", [y, lw.value(other)], {"dim": call.args["dim"]})
    return y


def transpose_2d(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """`t` of a matrix and a permute that swaps the last two dims are transposes."""
    x = lw.value(_first(call))
    rank = x.example.dim()
    if call.packet == "t" and rank < 2:
        return x
    if call.packet == "permute":
        dims = [d % rank for d in call.args["dims"]]
        if rank < 2 or dims != [*range(rank - 2), rank - 1, rank - 2]:
            raise Decline("not a swap of the last two dims")
    return registry_op(lw, "transpose", [x], {"dim0": -2, "dim1": -1})


def _operand(lw: Lowering, arg: Any) -> tuple[str, tuple[int, ...]]:
    """A float32 tensor's ref and shape, or a Python number's text and shape `()`."""
    if isinstance(arg, Node):
        value = lw.value(arg)
        if value.example.dtype != torch.float32:
            raise Decline("not a float32 tensor")
        return value.ref, tuple(value.example.shape)
    if is_number(arg):
        return literal(arg), ()
    raise Decline("neither a tensor nor a Python number")


def _number_line(lw: Lowering, name: str, args: Sequence[Any], params: dict[str, Any]) -> Value:
    """A line applying the registry's binary `name` to tensors or Python numbers."""
    op = REGISTRY[name]
    refs, shapes = zip(*(_operand(lw, arg) for arg in args), strict=True)
    expr = canonical(op, refs, shapes, params) or spelled(op, refs, params)
    if expr is None:
        raise Decline(f"{name} with {params} has no spelling")
    return lw.line(expr, name, mapped=True)


def reverse_sub(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """`rsub(x, c, alpha)` is `c - alpha * x` (`2.0 - x` traces to it): the registry's
    sub with its operands swapped, `torch.sub(2.0, x)`."""
    args = [call.args["other"], call.args["self"]]
    return _number_line(lw, "sub", args, {"alpha": call.args["alpha"]})


def reciprocal(lw: Lowering, call: AtenCall, index: int | None) -> Value:
    """`1 / x` (`c / x` traces to reciprocal, then mul) is `torch.div(1.0, x)`."""
    return _number_line(lw, "div", [1.0, call.args["self"]], {})


Rewrite = Callable[["Lowering", AtenCall, "int | None"], Value]

REWRITES: dict[str, Rewrite] = {
    **{name: identity for name in ("clone", "alias", "detach", "lift_fresh_copy", "contiguous")},
    **{name: identity for name in DROPOUTS},
    "_to_copy": cast_indices,
    "div": softsign,
    "linear": linear,
    "addmm": addmm,
    **{f"conv{n}d": conv_bias for n in (1, 2, 3)},
    **{f"conv_transpose{n}d": conv_bias for n in (1, 2, 3)},
    "layer_norm": layer_norm,
    "group_norm": channel_norm,
    "instance_norm": channel_norm,
    "batch_norm": batch_norm,
    "_native_batch_norm_legit": batch_norm,
    "_native_batch_norm_legit_functional": batch_norm,
    **{
        name: reduce_dims
        for name in ("sum", "mean", "amax", "amin", "linalg_vector_norm", "max", "min")
    },
    "cat": cat,
    "t": transpose_2d,
    "permute": transpose_2d,
    "rsub": reverse_sub,
    "reciprocal": reciprocal,
}
"""ATen operator (packet name) -> its rewrite."""
