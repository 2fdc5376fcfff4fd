"""Read a functional-format problem into a flat list of operator applications.

The problem format is the contract of the whole project (one operator call per line,
`get_inputs()` building every input with `torch.randn`). Parsing uses Python's `ast`,
so formatting details (spacing, positional vs keyword arguments) do not matter, and
any straight-line program is accepted: names are free and may be reassigned
(`t = torch.relu(t)`), since every value is renamed to `tensor_N`, N in order of
definition (inputs first). That is the generator's own numbering, so its programs keep
their names, and a program translates to the same code whatever it calls its tensors.
How each operator may be called (names, arguments, defaults) and its shape rule come
from the operator registry (`synth.operators`, through `.operators`); what is checked
here is what the templates support. Anything else is refused with a message naming the
line. Shapes are inferred statically: the teacher plans kernels (ranks, fusion) from
them, but the code it emits reads every size at run time. A Python number written in
place of a tensor (`torch.mul(x, 0.5)`, `torch.sub(1.0, x)`, where the registry's
`Call.numbers` allows one) is an `Op`'s `numbers` entry, as the float32 value PyTorch
computes with (`synth.teacher.numbers`), and becomes a literal in the kernel.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from synth.operators.call import REQUIRED
from synth.operators.infer import ShapeError, output_shape

from .numbers import NumberError, float32_literal, float32_value
from .operators import BY_CALL, COPY, OPERATORS, OperatorSpec

Shape = tuple[int, ...]


class TranslationError(ValueError):
    """The problem is not in the functional format, or uses an unsupported operator."""


@dataclass(frozen=True)
class Op:
    """One line of `fused_operator`: `out = kind(*inputs, **params)`."""

    out: str
    kind: str
    inputs: tuple[str, ...]
    params: dict[str, Any]
    line: int = 0
    numbers: dict[str, float] = field(default_factory=dict)
    """Tensor argument (by PyTorch's keyword) -> the Python number written in its place,
    as its float32 value; `inputs` holds the other, tensor, arguments."""

    @property
    def family(self) -> str:
        return OPERATORS[self.kind].family

    def operands(self, tensors: Sequence[str]) -> list[str]:
        """The call's operands in PyTorch's order: `tensors` stand for `inputs`, one each,
        and each number is a float32 literal (parenthesised when negative)."""
        if not self.numbers:
            return list(tensors)
        remaining = iter(tensors)
        return [
            _operand_literal(self.numbers[name]) if name in self.numbers else next(remaining)
            for name in OPERATORS[self.kind].tensor_args
        ]


def _operand_literal(value: float) -> str:
    text = float32_literal(value)
    return f"({text})" if text.startswith("-") else text


@dataclass
class Program:
    """A parsed problem: its inputs, operator applications and returned tensors."""

    inputs: list[str]
    ops: list[Op]
    outputs: list[str]
    shapes: dict[str, Shape] = field(default_factory=dict)

    def producer(self, name: str) -> Op | None:
        for op in self.ops:
            if op.out == name:
                return op
        return None

    def consumers(self, name: str) -> list[Op]:
        return [op for op in self.ops if name in op.inputs]


# --------------------------------------------------------------------------- shapes


def infer_shape(op: Op, shapes: dict[str, Shape]) -> Shape:
    """The static output shape of `op`, by the registry's shape rule for its operator (a
    number operand is 0-d)."""
    ins = [shapes[name] for name in op.inputs]
    if op.kind == COPY:
        return ins[0]
    if op.numbers:
        tensors = iter(ins)
        names = OPERATORS[op.kind].tensor_args
        ins = [() if name in op.numbers else next(tensors) for name in names]
    try:
        return output_shape(op.kind, ins, op.params)
    except ShapeError as err:
        raise TranslationError(f"line {op.line}: {err}") from None


# --------------------------------------------------------------------------- parsing


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    name = ".".join(reversed(parts))
    if name.startswith("torch.nn.functional."):
        name = "F." + name[len("torch.nn.functional.") :]
    return name


def _literal(node: ast.expr, line: int) -> Any:
    # `torch.zeros(C, device=x.device)` / `torch.ones(...)`: BatchNorm's inline running stats.
    if isinstance(node, ast.Call) and _dotted(node.func) in ("torch.zeros", "torch.ones"):
        return _dotted(node.func)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise TranslationError(
            f"line {line}: expected a constant, got `{ast.unparse(node)}`"
        ) from None


def _split_call(value: ast.expr) -> tuple[ast.Call, str | None]:
    """Strip a trailing `.values` (or `[0]`) or `.float()` and return the operator call."""
    if (
        isinstance(value, ast.Subscript)
        and isinstance(value.value, ast.Call)
        and isinstance(value.slice, ast.Constant)
        and value.slice.value == 0
        and type(value.slice.value) is int
    ):
        return value.value, ".values"  # `torch.max(x, dim)[0]` is its `.values`
    if (
        isinstance(value, ast.Attribute)
        and value.attr == "values"
        and isinstance(value.value, ast.Call)
    ):
        return value.value, ".values"
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "float"
        and not value.args
        and not value.keywords
        and isinstance(value.func.value, ast.Call)
    ):
        return value.func.value, ".float()"
    if isinstance(value, ast.Call):
        return value, None
    raise TranslationError(
        f"line {value.lineno}: expected an operator call, got `{ast.unparse(value)}`"
    )


def _number(node: ast.expr, what: str, line: int) -> float:
    """The float32 value of a Python number written as `node` (`0.5`, `-2`, `1e-3`)."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise TranslationError(
            f"line {line}: {what} must be a tensor name or a Python number, "
            f"got `{ast.unparse(node)}`"
        ) from None
    try:
        return float32_value(value)
    except NumberError as err:
        raise TranslationError(f"line {line}: {what}: {err}") from None


def _is_literal(node: ast.expr) -> bool:
    """A constant, or a signed one (`-0.5`): what a number operand is written as."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant)


def _tensor_name(node: ast.expr, env: dict[str, str], line: int) -> str:
    """The SSA name of the tensor a source name holds at this line."""
    if not isinstance(node, ast.Name):
        raise TranslationError(f"line {line}: expected a tensor name, got `{ast.unparse(node)}`")
    if node.id not in env:
        raise TranslationError(f"line {line}: `{node.id}` is used before it is defined")
    return env[node.id]


def _int_param(value: Any, name: str, kind: str, line: int) -> int:
    """Pooling/conv parameters: one int, or a tuple with the same int in every dim."""
    if isinstance(value, list | tuple):
        if not value or any(v != value[0] for v in value):
            raise TranslationError(f"line {line}: {kind} {name}={value} differs across dims")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TranslationError(f"line {line}: {kind} {name} must be an int, got {value!r}")
    return value


def _normalise(
    spec: OperatorSpec, params: dict[str, Any], shapes: list[Shape], line: int
) -> dict[str, Any]:
    """Check parameter values the templates rely on and put them in canonical form.

    Each step checks one operator or family and edits the copy `p` in place. They run
    in a fixed order, so a call with several faults is always refused for the same one.
    """
    kind = spec.kind
    where = f"line {line}: {kind}"
    p = dict(params)
    rank = len(shapes[0]) if shapes else 0
    if spec.family in ("reduction", "softmax", "scan") or kind in ("cat", "stack"):
        _normalise_dim(p, kind, rank, where)
    _normalise_reduction(p, kind, where)
    if kind == "transpose":
        _check_transpose(p, rank, where)
    _normalise_pointwise(p, kind, where)
    norm_check = _NORM_CHECKS.get(kind)
    if norm_check is not None:
        norm_check(p, shapes, where)
    if spec.family == "pool":
        _normalise_pool(p, kind, line, where)
    if spec.family == "conv":
        _normalise_conv(p, kind, line, where)
    return p


def _normalise_dim(p: dict[str, Any], kind: str, rank: int, where: str) -> None:
    """`dim` in range, made non-negative (stack's counts the new dim too)."""
    dim = p["dim"]
    dim_rank = rank + 1 if kind == "stack" else rank  # >= 1: ranks are checked first
    if not isinstance(dim, int) or not -dim_rank <= dim < dim_rank:
        raise TranslationError(f"{where}: dim={dim!r} is out of range for rank {rank}")
    p["dim"] = dim % dim_rank


def _normalise_reduction(p: dict[str, Any], kind: str, where: str) -> None:
    """var's correction from either spelling, the 2-norm only, and `keepdim` a bool."""
    if kind == "var":
        correction = p.pop("correction")
        unbiased = p.pop("unbiased")
        p["correction"] = int(unbiased) if correction is None else correction
    if kind == "norm" and p.pop("p") not in (2, 2.0, "fro"):
        raise TranslationError(f"{where}: only the 2-norm is supported")
    if kind in ("max", "min", "argmax", "argmin", "sum", "mean", "var", "norm"):
        p["keepdim"] = bool(p["keepdim"])


def _check_transpose(p: dict[str, Any], rank: int, where: str) -> None:
    """Only the last two dims may be swapped (the one transpose the layouts implement)."""
    dims = (p.pop("dim0"), p.pop("dim1"))
    if not all(isinstance(d, int) and -rank <= d < rank for d in dims):
        raise TranslationError(f"{where}: dims {dims} are out of range for rank {rank}")
    d0, d1 = sorted(d % rank for d in dims)
    if (d0, d1) != (rank - 2, rank - 1):
        raise TranslationError(f"{where}: only transpose of the last two dims is supported")


def _normalise_pointwise(p: dict[str, Any], kind: str, where: str) -> None:
    """The exact GELU, `alpha` as float32, no in-place variant, and a clamp with a bound."""
    if kind == "gelu" and p["approximate"] != "none":
        raise TranslationError(f"{where}: only the exact (erf) GELU is supported")
    if "alpha" in p:  # add, sub: `other` scaled by alpha, a float32 number like operands
        try:
            p["alpha"] = float32_value(p["alpha"])
        except NumberError as err:
            raise TranslationError(f"{where}: alpha: {err}") from None
    for flag in ("inplace",):
        if p.pop(flag, False):
            raise TranslationError(f"{where}: in-place variants are not supported")
    if kind == "clamp" and p["min"] is None and p["max"] is None:
        raise TranslationError(f"{where}: clamp needs min or max")


def _check_batch_norm(p: dict[str, Any], shapes: list[Shape], where: str) -> None:
    """Training mode (batch statistics) without affine weights; the running stats dropped."""
    if not p.pop("training") or p.pop("weight") is not None or p.pop("bias") is not None:
        raise TranslationError(f"{where}: only training=True without affine weights is supported")
    p.pop("running_mean"), p.pop("running_var"), p.pop("momentum")


def _check_layer_norm(p: dict[str, Any], shapes: list[Shape], where: str) -> None:
    """No affine weights; `normalized_shape` a suffix of the input's, kept as `n_dims`."""
    normalized = list(p.pop("normalized_shape"))
    if p.pop("weight") is not None or p.pop("bias") is not None:
        raise TranslationError(f"{where}: affine weights are not supported")
    rank = len(shapes[0])
    if not normalized or tuple(normalized) != tuple(shapes[0][rank - len(normalized) :]):
        raise TranslationError(
            f"{where}: normalized_shape {normalized} is not a suffix of the shape"
        )
    p["n_dims"] = len(normalized)


def _check_group_norm(p: dict[str, Any], shapes: list[Shape], where: str) -> None:
    """No affine weights, and groups that split the channels evenly."""
    if p.pop("weight") is not None or p.pop("bias") is not None:
        raise TranslationError(f"{where}: affine weights are not supported")
    if shapes[0][1] % p["num_groups"]:
        raise TranslationError(f"{where}: channels are not divisible by num_groups")


def _check_instance_norm(p: dict[str, Any], shapes: list[Shape], where: str) -> None:
    """Only the default form: input statistics, no running stats, no affine weights."""
    extra = ("running_mean", "running_var", "weight", "bias")
    if any(p.pop(name) is not None for name in extra) or not p.pop("use_input_stats"):
        raise TranslationError(f"{where}: only the default (input statistics) form is supported")
    p.pop("momentum")


_NORM_CHECKS: dict[str, Callable[[dict[str, Any], list[Shape], str], None]] = {
    "batch_norm": _check_batch_norm,
    "layer_norm": _check_layer_norm,
    "group_norm": _check_group_norm,
    "instance_norm": _check_instance_norm,
}
"""Per normalisation operator, the check of its form (the forms the templates support)."""


def _normalise_pool(p: dict[str, Any], kind: str, line: int, where: str) -> None:
    """`nd` from the name, one int per window parameter (stride defaults to the kernel
    size), and only the default ceil_mode / padding count / divisor."""
    p["nd"] = int(kind[-2])
    for name in ("kernel_size", "padding", "dilation"):
        if name in p:
            p[name] = _int_param(p[name], name, kind, line)
    p["stride"] = (
        p["kernel_size"]
        if p["stride"] in (None, [], ())
        else _int_param(p["stride"], "stride", kind, line)
    )
    if p.pop("ceil_mode") or p.pop("return_indices", False):
        raise TranslationError(f"{where}: ceil_mode / return_indices are not supported")
    if kind.startswith("avg") and (
        not p.pop("count_include_pad") or p.pop("divisor_override", None) is not None
    ):
        raise TranslationError(f"{where}: only count_include_pad=True without divisor_override")


def _normalise_conv(p: dict[str, Any], kind: str, line: int, where: str) -> None:
    """`nd` from the name, no bias, and one int per parameter (the same in every dim)."""
    p["nd"] = int(kind[-2])
    if p.pop("bias") is not None:
        raise TranslationError(f"{where}: bias is not supported")
    for name in ("stride", "padding", "dilation", "output_padding", "groups"):
        if name in p:
            p[name] = _int_param(p[name], name, kind, line)


CLAMP_FORMS = frozenset({"maximum", "minimum"})
"""Operators whose scalar form is another call (`torch.clamp(x, min=0.1)`)."""


def _bind(
    spec: OperatorSpec, call: ast.Call, env: dict[str, str], line: int
) -> tuple[list[str], dict[str, Any], dict[str, float]]:
    """Bind a call's arguments like Python would: (tensor names, parameter values, the
    Python numbers given for tensor arguments)."""
    args = list(call.args)
    keywords = {kw.arg: kw.value for kw in call.keywords}
    if None in keywords:
        raise TranslationError(f"line {line}: `**kwargs` is not supported")
    call_spec = spec.call
    if call_spec.tensor_list:
        node = args.pop(0) if args else keywords.pop(call_spec.tensors[0], None)
        if not isinstance(node, ast.List | ast.Tuple) or len(node.elts) != spec.arity:
            raise TranslationError(
                f"line {line}: {spec.kind} expects a list of {spec.arity} tensors"
            )
        tensors = [_tensor_name(elt, env, line) for elt in node.elts]
    else:
        tensors = []
        for key in spec.tensor_args:
            node = args.pop(0) if args else keywords.pop(key, None)
            if node is None:
                raise TranslationError(
                    f"line {line}: {spec.kind} is missing tensor argument `{key}`"
                )
            if isinstance(node, ast.Name) or not (key in call_spec.numbers or _is_literal(node)):
                tensors.append(_tensor_name(node, env, line))
            else:  # a Python number in place of a tensor
                tensors.append((key, _number(node, f"{spec.kind}'s `{key}`", line)))
        reason = call_spec.number_error([item[0] for item in tensors if isinstance(item, tuple)])
        if reason is not None:
            hint = " (the scalar form is torch.clamp)" if spec.kind in CLAMP_FORMS else ""
            raise TranslationError(f"line {line}: {spec.kind}: {reason}{hint}")
    params: dict[str, Any] = {}
    names = list(call_spec.param_names)
    if len(args) > len(names):
        raise TranslationError(f"line {line}: {spec.kind} got too many arguments")
    for name, node in zip(names, args, strict=False):
        params[name] = _literal(node, line)
    for name, node in keywords.items():
        if name not in names:
            raise TranslationError(f"line {line}: {spec.kind} got an unexpected argument `{name}`")
        if name in params:
            raise TranslationError(f"line {line}: {spec.kind} got `{name}` twice")
        params[name] = _literal(node, line)
    for name, default in call_spec.params:
        if name not in params:
            if default is REQUIRED:
                raise TranslationError(f"line {line}: {spec.kind} is missing `{name}`")
            params[name] = default
    numbers = dict(item for item in tensors if isinstance(item, tuple))
    return [item for item in tensors if isinstance(item, str)], params, numbers


def _find_function(module: ast.Module, name: str) -> ast.FunctionDef:
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise TranslationError(f"the problem does not define `{name}()`")


def _returned_names(func: ast.FunctionDef) -> list[str]:
    last = func.body[-1]
    if not isinstance(last, ast.Return) or not isinstance(last.value, ast.List | ast.Tuple):
        raise TranslationError(f"`{func.name}()` must end with `return [tensor, ...]`")
    names = []
    for elt in last.value.elts:
        if not isinstance(elt, ast.Name):
            raise TranslationError(f"`{func.name}()` must return tensor names")
        names.append(elt.id)
    return names


def _parse_inputs(func: ast.FunctionDef) -> dict[str, Shape]:
    shapes: dict[str, Shape] = {}
    for stmt in func.body[:-1]:
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Call)
            and _dotted(stmt.value.func) == "torch.randn"
        ):
            raise TranslationError(
                f"line {stmt.lineno}: get_inputs() may only create tensors with torch.randn"
            )
        call = stmt.value
        if len(call.args) == 1 and isinstance(call.args[0], ast.List | ast.Tuple):
            dims = _literal(call.args[0], stmt.lineno)
        else:
            dims = [_literal(arg, stmt.lineno) for arg in call.args]
        for kw in call.keywords:
            if kw.arg == "dtype" and _dotted(kw.value) not in ("torch.float32", "torch.float"):
                raise TranslationError(f"line {stmt.lineno}: only float32 inputs are supported")
            if kw.arg == "size":
                dims = _literal(kw.value, stmt.lineno)
        if not all(isinstance(d, int) and d >= 1 for d in dims):
            raise TranslationError(f"line {stmt.lineno}: bad input shape {dims}")
        shapes[stmt.targets[0].id] = tuple(dims)
    return shapes


def _target(stmt: ast.Assign | ast.AnnAssign) -> str:
    target = _target_node(stmt)
    assert isinstance(target, ast.Name)  # checked by `_operator_lines`
    return target.id


def _operator_lines(func: ast.FunctionDef) -> list[ast.Assign | ast.AnnAssign]:
    """The body's `name = call(...)` statements (annotated or not); a docstring is skipped."""
    lines: list[ast.Assign | ast.AnnAssign] = []
    for index, stmt in enumerate(func.body[:-1]):
        if (
            index == 0
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            continue
        single = isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
        annotated = isinstance(stmt, ast.AnnAssign) and stmt.value is not None
        if not (single or annotated) or not isinstance(_target_node(stmt), ast.Name):
            raise TranslationError(
                f"line {stmt.lineno}: expected `name = operator(...)`, one per line"
            )
        lines.append(stmt)
    return lines


def _target_node(stmt: ast.stmt) -> ast.expr | None:
    if isinstance(stmt, ast.Assign):
        return stmt.targets[0]
    return stmt.target if isinstance(stmt, ast.AnnAssign) else None


def parse_program(source: str) -> Program:
    """Parse a problem's source into a `Program`; raises `TranslationError` if unsupported."""
    try:
        module = ast.parse(source)
    except SyntaxError as err:
        raise TranslationError(
            f"the problem is not valid Python: {err.msg} (line {err.lineno})"
        ) from None
    input_func = _find_function(module, "get_inputs")
    func = _find_function(module, "fused_operator")
    input_shapes = _parse_inputs(input_func)
    input_order = _returned_names(input_func)
    args = [arg.arg for arg in func.args.args]
    if len(args) != len(input_order):
        raise TranslationError(
            f"fused_operator takes {len(args)} arguments but get_inputs() returns {len(input_order)}"
        )
    env = {arg: f"tensor_{i}" for i, arg in enumerate(args)}  # source name -> SSA name
    shapes: dict[str, Shape] = {}
    for arg, produced in zip(args, input_order, strict=True):
        if produced not in input_shapes:
            raise TranslationError(f"get_inputs() returns `{produced}`, which it does not create")
        shapes[env[arg]] = input_shapes[produced]
    ops: list[Op] = []
    for stmt in _operator_lines(func):
        line = stmt.lineno
        call, suffix = _split_call(stmt.value)
        name = _dotted(call.func)
        spec = BY_CALL.get(name or "")
        if spec is None:
            raise TranslationError(
                f"line {line}: unsupported operator `{name or ast.unparse(call.func)}`"
            )
        if spec.call.suffix != suffix:
            want = f"`{spec.call.suffix}`" if spec.call.suffix else "no suffix"
            raise TranslationError(f"line {line}: `{name}(...)` must be followed by {want}")
        tensors, params, numbers = _bind(spec, call, env, line)
        in_shapes = [shapes[t] for t in tensors]
        reason = spec.call.rank_error([len(s) for s in in_shapes])
        if reason is not None:
            raise TranslationError(f"line {line}: {spec.kind}: {reason}")
        params = _normalise(spec, params, in_shapes, line)
        out = f"tensor_{len(args) + len(ops)}"
        op = Op(out, spec.kind, tuple(tensors), params, line=line, numbers=numbers)
        shapes[out] = infer_shape(op, shapes)
        ops.append(op)
        env[_target(stmt)] = out  # a reassigned name now means the new value
    outputs = []
    for name in _returned_names(func):
        if name not in env:
            raise TranslationError(f"fused_operator returns `{name}`, which it does not define")
        outputs.append(env[name])
    if not outputs:
        raise TranslationError("fused_operator returns no tensors")
    inputs = [f"tensor_{i}" for i in range(len(args))]
    return Program(inputs=inputs, ops=ops, outputs=outputs, shapes=shapes)
