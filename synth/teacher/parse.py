"""Read a functional-format problem into a flat list of operator applications.

The problem format is the contract of the whole project (one operator call per line,
`get_inputs()` building every input with `torch.randn`). Parsing uses Python's `ast`,
so formatting details (spacing, positional vs keyword arguments) do not matter, and
any straight-line program is accepted: names are free and may be reassigned
(`t = torch.relu(t)`), since every value is renamed to `tensor_N`, N in order of
definition (inputs first). That is the generator's own numbering, so its programs keep
their names, and a program translates to the same code whatever it calls its tensors.
Anything outside the operator table is refused with a message naming the line. Shapes are inferred statically: the teacher plans
kernels (ranks, fusion) from them, but the code it emits reads every size at run
time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

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

    @property
    def family(self) -> str:
        return OPERATORS[self.kind].family


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


# --------------------------------------------------------------------------- operators


@dataclass(frozen=True)
class OperatorSpec:
    """How one PyTorch call is recognised, bound and shaped.

    `params` lists the non-tensor parameters in positional order with their
    defaults (`REQUIRED` when the call must give them). `suffix` is the attribute
    or method that must follow the call (`.values`, `.float()`).
    """

    kind: str
    family: str
    calls: tuple[str, ...]
    n_tensors: int
    params: tuple[tuple[str, Any], ...] = ()
    suffix: str | None = None
    tensor_list: bool = False  # cat/stack take their tensors as one list argument

    @property
    def tensor_args(self) -> tuple[str, ...]:
        """Keyword names of the tensor arguments, as PyTorch spells them."""
        if self.family == "conv":
            return ("input", "weight")
        if self.kind == "bmm":
            return ("input", "mat2")
        if self.kind == "lerp":
            return ("input", "end", "weight")
        return ("input", "other")[: self.n_tensors]


REQUIRED = object()

_POOL_PARAMS_AVG = (
    ("kernel_size", REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("ceil_mode", False),
    ("count_include_pad", True),
    ("divisor_override", None),
)
_POOL_PARAMS_MAX = (
    ("kernel_size", REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("dilation", 1),
    ("ceil_mode", False),
    ("return_indices", False),
)
_CONV_PARAMS = (("bias", None), ("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))
_CONV_T_PARAMS = (
    ("bias", None),
    ("stride", 1),
    ("padding", 0),
    ("output_padding", 0),
    ("groups", 1),
    ("dilation", 1),
)
_REDUCE_PARAMS = (("dim", REQUIRED), ("keepdim", False))


def _specs() -> list[OperatorSpec]:
    specs = [
        OperatorSpec(kind, "pointwise", (f"torch.{kind}",), 2)
        for kind in ("add", "sub", "mul", "div", "maximum", "minimum")
    ]
    specs += [
        OperatorSpec("lerp", "pointwise", ("torch.lerp",), 3),
        OperatorSpec("matmul", "matmul", ("torch.matmul",), 2),
        OperatorSpec("bmm", "matmul", ("torch.bmm",), 2),
        OperatorSpec("sum", "reduction", ("torch.sum",), 1, _REDUCE_PARAMS),
        OperatorSpec("mean", "reduction", ("torch.mean",), 1, _REDUCE_PARAMS),
        OperatorSpec("max", "reduction", ("torch.max",), 1, _REDUCE_PARAMS, suffix="values"),
        OperatorSpec("min", "reduction", ("torch.min",), 1, _REDUCE_PARAMS, suffix="values"),
        OperatorSpec("argmax", "reduction", ("torch.argmax",), 1, _REDUCE_PARAMS, "float"),
        OperatorSpec("argmin", "reduction", ("torch.argmin",), 1, _REDUCE_PARAMS, "float"),
        OperatorSpec(
            "var",
            "reduction",
            ("torch.var",),
            1,
            (("dim", REQUIRED), ("unbiased", True), ("keepdim", False), ("correction", None)),
        ),
        OperatorSpec(
            "norm",
            "reduction",
            ("torch.norm",),
            1,
            (("p", 2), ("dim", REQUIRED), ("keepdim", False)),
        ),
        OperatorSpec(
            "transpose", "layout", ("torch.transpose",), 1, (("dim0", REQUIRED), ("dim1", REQUIRED))
        ),
        OperatorSpec(
            "cat", "layout", ("torch.cat", "torch.concat"), 2, (("dim", 0),), tensor_list=True
        ),
        OperatorSpec("stack", "layout", ("torch.stack",), 2, (("dim", 0),), tensor_list=True),
        OperatorSpec("triu", "pointwise", ("torch.triu",), 1, (("diagonal", 0),)),
        OperatorSpec("tril", "pointwise", ("torch.tril",), 1, (("diagonal", 0),)),
        OperatorSpec("relu", "pointwise", ("torch.relu", "F.relu"), 1),
        OperatorSpec(
            "leaky_relu",
            "pointwise",
            ("F.leaky_relu",),
            1,
            (("negative_slope", 0.01), ("inplace", False)),
        ),
        OperatorSpec("sigmoid", "pointwise", ("torch.sigmoid", "F.sigmoid"), 1),
        OperatorSpec("tanh", "pointwise", ("torch.tanh", "F.tanh"), 1),
        OperatorSpec("softmax", "softmax", ("torch.softmax", "F.softmax"), 1, (("dim", REQUIRED),)),
        OperatorSpec(
            "log_softmax",
            "softmax",
            ("torch.log_softmax", "F.log_softmax"),
            1,
            (("dim", REQUIRED),),
        ),
        OperatorSpec("silu", "pointwise", ("F.silu",), 1, (("inplace", False),)),
        OperatorSpec("gelu", "pointwise", ("F.gelu",), 1, (("approximate", "none"),)),
        OperatorSpec("selu", "pointwise", ("torch.selu", "F.selu"), 1),
        OperatorSpec("hardsigmoid", "pointwise", ("F.hardsigmoid",), 1, (("inplace", False),)),
        OperatorSpec(
            "softplus", "pointwise", ("F.softplus",), 1, (("beta", 1.0), ("threshold", 20.0))
        ),
        OperatorSpec("softsign", "pointwise", ("F.softsign",), 1),
        OperatorSpec("elu", "pointwise", ("F.elu",), 1, (("alpha", 1.0), ("inplace", False))),
        OperatorSpec(
            "hardtanh",
            "pointwise",
            ("F.hardtanh",),
            1,
            (("min_val", -1.0), ("max_val", 1.0), ("inplace", False)),
        ),
        OperatorSpec("clamp", "pointwise", ("torch.clamp",), 1, (("min", None), ("max", None))),
        OperatorSpec("logsigmoid", "pointwise", ("F.logsigmoid",), 1),
        OperatorSpec("cos", "pointwise", ("torch.cos",), 1),
        OperatorSpec("sin", "pointwise", ("torch.sin",), 1),
        OperatorSpec("exp2", "pointwise", ("torch.exp2",), 1),
        OperatorSpec("abs", "pointwise", ("torch.abs",), 1),
        OperatorSpec("cumsum", "scan", ("torch.cumsum",), 1, (("dim", REQUIRED),)),
        OperatorSpec("cummax", "scan", ("torch.cummax",), 1, (("dim", REQUIRED),), suffix="values"),
        OperatorSpec("cummin", "scan", ("torch.cummin",), 1, (("dim", REQUIRED),), suffix="values"),
        OperatorSpec(
            "batch_norm",
            "norm",
            ("F.batch_norm",),
            1,
            (
                ("running_mean", REQUIRED),
                ("running_var", REQUIRED),
                ("weight", None),
                ("bias", None),
                ("training", False),
                ("momentum", 0.1),
                ("eps", 1e-5),
            ),
        ),
        OperatorSpec(
            "layer_norm",
            "norm",
            ("F.layer_norm",),
            1,
            (("normalized_shape", REQUIRED), ("weight", None), ("bias", None), ("eps", 1e-5)),
        ),
        OperatorSpec(
            "group_norm",
            "norm",
            ("F.group_norm",),
            1,
            (("num_groups", REQUIRED), ("weight", None), ("bias", None), ("eps", 1e-5)),
        ),
        OperatorSpec(
            "instance_norm",
            "norm",
            ("F.instance_norm",),
            1,
            (
                ("running_mean", None),
                ("running_var", None),
                ("weight", None),
                ("bias", None),
                ("use_input_stats", True),
                ("momentum", 0.1),
                ("eps", 1e-5),
            ),
        ),
    ]
    for nd in (1, 2, 3):
        specs += [
            OperatorSpec(f"avg_pool{nd}d", "pool", (f"F.avg_pool{nd}d",), 1, _POOL_PARAMS_AVG),
            OperatorSpec(f"max_pool{nd}d", "pool", (f"F.max_pool{nd}d",), 1, _POOL_PARAMS_MAX),
            OperatorSpec(f"conv{nd}d", "conv", (f"F.conv{nd}d",), 2, _CONV_PARAMS),
            OperatorSpec(
                f"conv_transpose{nd}d", "conv", (f"F.conv_transpose{nd}d",), 2, _CONV_T_PARAMS
            ),
        ]
    # Not a PyTorch call: the planner's copy of a view or an input into fresh memory.
    specs.append(OperatorSpec("copy", "pointwise", (), 1))
    return specs


OPERATORS: dict[str, OperatorSpec] = {spec.kind: spec for spec in _specs()}
_BY_CALL: dict[str, OperatorSpec] = {
    call: spec for spec in OPERATORS.values() for call in spec.calls
}


# --------------------------------------------------------------------------- shapes


def broadcast(*shapes: Shape) -> Shape:
    """NumPy/PyTorch broadcasting of right-aligned shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        sizes = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(sizes) > 1:
            raise TranslationError(f"shapes {list(map(list, shapes))} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _matmul_shape(a: Shape, b: Shape, kind: str) -> Shape:
    if len(a) < 2 or len(b) < 2:
        raise TranslationError(f"{kind} needs operands of rank >= 2, got {list(a)} and {list(b)}")
    if kind == "bmm" and (len(a) != 3 or len(b) != 3 or a[0] != b[0]):
        raise TranslationError(
            f"bmm needs two rank-3 operands of equal batch, got {list(a)} {list(b)}"
        )
    if a[-1] != b[-2]:
        raise TranslationError(f"{kind}: inner sizes differ ({list(a)} @ {list(b)})")
    return (*broadcast(a[:-2], b[:-2]), a[-2], b[-1])


def _reduce_shape(x: Shape, dim: int, keepdim: bool) -> Shape:
    if keepdim:
        return x[:dim] + (1,) + x[dim + 1 :]
    return x[:dim] + x[dim + 1 :]


def _pool_out(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def infer_shape(op: Op, shapes: dict[str, Shape]) -> Shape:
    """The static output shape of `op`, given the shapes of its inputs."""
    ins = [shapes[name] for name in op.inputs]
    p = op.params
    family = op.family
    if op.kind in ("triu", "tril"):
        if len(ins[0]) < 2:
            raise TranslationError(f"{op.kind} needs rank >= 2")
        return ins[0]
    if family == "pointwise":
        return broadcast(*ins)
    if family == "matmul":
        return _matmul_shape(ins[0], ins[1], op.kind)
    if family == "reduction":
        return _reduce_shape(ins[0], p["dim"], p["keepdim"])
    if op.kind == "transpose":
        x = ins[0]
        return x[:-2] + (x[-1], x[-2])
    if op.kind == "cat":
        a, b = ins
        d = p["dim"]
        if len(a) != len(b) or a[:d] + a[d + 1 :] != b[:d] + b[d + 1 :]:
            raise TranslationError(f"cat: shapes {list(a)} and {list(b)} differ off dim {d}")
        return a[:d] + (a[d] + b[d],) + a[d + 1 :]
    if op.kind == "stack":
        a, b = ins
        if a != b:
            raise TranslationError(f"stack: shapes {list(a)} and {list(b)} differ")
        return a[: p["dim"]] + (2,) + a[p["dim"] :]
    if family in ("softmax", "scan", "norm"):
        return ins[0]
    if family == "pool":
        x = ins[0]
        nd = p["nd"]
        dilation = p.get("dilation", 1)
        spatial = tuple(
            _pool_out(s, p["kernel_size"], p["stride"], p["padding"], dilation) for s in x[-nd:]
        )
        return x[:-nd] + spatial
    if family == "conv":
        x, w = ins
        nd = p["nd"]
        kernel = w[-nd:]
        if op.kind.startswith("conv_transpose"):
            spatial = tuple(
                (s - 1) * p["stride"]
                - 2 * p["padding"]
                + p["dilation"] * (k - 1)
                + p["output_padding"]
                + 1
                for s, k in zip(x[-nd:], kernel, strict=True)
            )
            out_channels = w[1] * p["groups"]
        else:
            spatial = tuple(
                _pool_out(s, k, p["stride"], p["padding"], p["dilation"])
                for s, k in zip(x[-nd:], kernel, strict=True)
            )
            out_channels = w[0]
        return x[: -nd - 1] + (out_channels,) + spatial
    raise TranslationError(f"no shape rule for {op.kind}")


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
        return value.value, "values"  # `torch.max(x, dim)[0]` is its `.values`
    if (
        isinstance(value, ast.Attribute)
        and value.attr == "values"
        and isinstance(value.value, ast.Call)
    ):
        return value.value, "values"
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "float"
        and not value.args
        and not value.keywords
        and isinstance(value.func.value, ast.Call)
    ):
        return value.func.value, "float"
    if isinstance(value, ast.Call):
        return value, None
    raise TranslationError(
        f"line {value.lineno}: expected an operator call, got `{ast.unparse(value)}`"
    )


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
    """Check parameter values the templates rely on and put them in canonical form."""
    kind = spec.kind
    where = f"line {line}: {kind}"
    p = dict(params)
    rank = len(shapes[0]) if shapes else 0
    if spec.family in ("reduction", "softmax", "scan") or kind in ("cat", "stack"):
        dim = p["dim"]
        dim_rank = rank + 1 if kind == "stack" else rank
        if not isinstance(dim, int) or not -max(dim_rank, 1) <= dim < max(dim_rank, 1):
            raise TranslationError(f"{where}: dim={dim!r} is out of range for rank {rank}")
        p["dim"] = dim % max(dim_rank, 1)
        if rank == 0 and kind not in ("stack",):
            raise TranslationError(f"{where}: rank-0 input is not supported")
    if kind == "var":
        correction = p.pop("correction")
        unbiased = p.pop("unbiased")
        p["correction"] = int(unbiased) if correction is None else correction
    if kind == "norm" and p.pop("p") not in (2, 2.0, "fro"):
        raise TranslationError(f"{where}: only the 2-norm is supported")
    if kind in ("max", "min", "argmax", "argmin", "sum", "mean", "var", "norm"):
        p["keepdim"] = bool(p["keepdim"])
    if kind == "transpose":
        d0, d1 = sorted(d % rank for d in (p.pop("dim0"), p.pop("dim1")))
        if rank < 2 or (d0, d1) != (rank - 2, rank - 1):
            raise TranslationError(f"{where}: only transpose of the last two dims is supported")
    if kind == "gelu" and p["approximate"] != "none":
        raise TranslationError(f"{where}: only the exact (erf) GELU is supported")
    for flag in ("inplace",):
        if p.pop(flag, False):
            raise TranslationError(f"{where}: in-place variants are not supported")
    if kind == "clamp" and p["min"] is None and p["max"] is None:
        raise TranslationError(f"{where}: clamp needs min or max")
    if kind == "batch_norm":
        if not p.pop("training") or p.pop("weight") is not None or p.pop("bias") is not None:
            raise TranslationError(
                f"{where}: only training=True without affine weights is supported"
            )
        p.pop("running_mean"), p.pop("running_var"), p.pop("momentum")
        if rank < 2:
            raise TranslationError(f"{where}: needs rank >= 2")
    if kind == "layer_norm":
        normalized = list(p.pop("normalized_shape"))
        if p.pop("weight") is not None or p.pop("bias") is not None:
            raise TranslationError(f"{where}: affine weights are not supported")
        if not normalized or tuple(normalized) != tuple(shapes[0][rank - len(normalized) :]):
            raise TranslationError(
                f"{where}: normalized_shape {normalized} is not a suffix of the shape"
            )
        p["n_dims"] = len(normalized)
    if kind == "group_norm":
        if p.pop("weight") is not None or p.pop("bias") is not None:
            raise TranslationError(f"{where}: affine weights are not supported")
        if rank < 2 or shapes[0][1] % p["num_groups"]:
            raise TranslationError(f"{where}: channels are not divisible by num_groups")
    if kind == "instance_norm":
        extra = ("running_mean", "running_var", "weight", "bias")
        if any(p.pop(name) is not None for name in extra) or not p.pop("use_input_stats"):
            raise TranslationError(
                f"{where}: only the default (input statistics) form is supported"
            )
        p.pop("momentum")
        if rank < 3:
            raise TranslationError(f"{where}: needs rank >= 3")
    if spec.family == "pool":
        nd = int(kind[-2])
        p["nd"] = nd
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
            not p.pop("count_include_pad") or p.pop("divisor_override") is not None
        ):
            raise TranslationError(f"{where}: only count_include_pad=True without divisor_override")
        if rank < nd + 1:
            raise TranslationError(f"{where}: needs rank >= {nd + 1}")
    if spec.family == "conv":
        nd = int(kind[-2])
        p["nd"] = nd
        if p.pop("bias") is not None:
            raise TranslationError(f"{where}: bias is not supported")
        for name in ("stride", "padding", "dilation", "output_padding", "groups"):
            if name in p:
                p[name] = _int_param(p[name], name, kind, line)
        if rank not in (nd + 1, nd + 2) or len(shapes[1]) != nd + 2:
            raise TranslationError(
                f"{where}: input/weight ranks {rank}/{len(shapes[1])} do not fit"
            )
    return p


def _bind(
    spec: OperatorSpec, call: ast.Call, env: dict[str, str], line: int
) -> tuple[list[str], dict[str, Any]]:
    """Bind a call's arguments to (tensor names, parameter values) like Python would."""
    args = list(call.args)
    keywords = {kw.arg: kw.value for kw in call.keywords}
    if None in keywords:
        raise TranslationError(f"line {line}: `**kwargs` is not supported")
    if spec.tensor_list:
        node = args.pop(0) if args else keywords.pop("tensors", None)
        if not isinstance(node, ast.List | ast.Tuple) or len(node.elts) != spec.n_tensors:
            raise TranslationError(
                f"line {line}: {spec.kind} expects a list of {spec.n_tensors} tensors"
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
            if spec.kind == "lerp" and key == "weight" and not isinstance(node, ast.Name):
                tensors.append(("weight", _literal(node, line)))  # scalar weight
                continue
            tensors.append(_tensor_name(node, env, line))
    params: dict[str, Any] = {}
    names = [name for name, _ in spec.params]
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
    for name, default in spec.params:
        if name not in params:
            if default is REQUIRED:
                raise TranslationError(f"line {line}: {spec.kind} is missing `{name}`")
            params[name] = default
    names_out: list[str] = []
    for item in tensors:
        if isinstance(item, tuple):  # lerp with a Python-number weight
            params["weight"] = float(item[1])
        else:
            names_out.append(item)
    return names_out, params


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
        spec = _BY_CALL.get(name or "")
        if spec is None:
            raise TranslationError(
                f"line {line}: unsupported operator `{name or ast.unparse(call.func)}`"
            )
        if spec.suffix != suffix:
            want = {"values": "`.values`", "float": "`.float()`", None: "no suffix"}[spec.suffix]
            raise TranslationError(f"line {line}: `{name}(...)` must be followed by {want}")
        tensors, params = _bind(spec, call, env, line)
        params = _normalise(spec, params, [shapes[t] for t in tensors], line)
        out = f"tensor_{len(args) + len(ops)}"
        op = Op(out=out, kind=spec.kind, inputs=tuple(tensors), params=params, line=line)
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
