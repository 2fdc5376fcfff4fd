"""Triton expressions for the pointwise operators (elementwise, any broadcasting).

Each entry turns an operator application into kernel lines that assign its output
register from its operand registers. The formulas are chosen to stay accurate in
float32 over the whole input range (no overflowing exponentials in unused `tl.where`
branches, stable softplus/logsigmoid), because the verifier compares with PyTorch
at a tight tolerance, relatively too: an output divided by a tiny value keeps its
relative error. So nothing cancels where PyTorch does not: elu/selu/tanh use an
accurate `expm1` where PyTorch does (`exp(x) - 1` near x = 0 keeps none of the
digits: an elu divided by the small values of a billion-element randn was 4 off),
softplus/logsigmoid an accurate `log1p` (`log(1 + z)` is 0 for z below 6e-8).
Triton's interpreter has no libdevice, so both are helper functions in plain `tl`
(`HELPERS`), emitted once per module for the operators that call them (`helpers_for`).
GELU keeps PyTorch's own formula, 0.5 * x * (1 + erf(x / sqrt(2))).
A Python number given for a tensor argument (`torch.mul(x, 0.5)`, lerp's weight) is an
operand like a register: its float32 literal, in its place (`Op.operands`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..numbers import float32_literal
from ..parse import Op

# Coordinates of the iteration space, by dimension: called only by triu/tril.
Coords = Callable[[], list[str]]

SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805


# exp(x) - 1: a Taylor polynomial of degree 8 for |x| < 0.5 (its truncation error is below
# float32's rounding there; x + x^2 * (...) rounds like x), exp(x) - 1 beyond, where the
# subtraction loses under one bit. Branch-free, as `tl.where` evaluates both sides (the
# polynomial's argument is kept in its range: no overflow in the unused side).
EXPM1 = """@triton.jit
def expm1(x):
    \"\"\"exp(x) - 1, accurate near 0 where exp(x) rounds to about 1.\"\"\"
    small = tl.abs(x) < 0.5
    t = tl.where(small, x, 0.0)
    poly = 1.0 / 720.0 + t * (1.0 / 5040.0 + t * (1.0 / 40320.0))
    poly = 0.5 + t * (1.0 / 6.0 + t * (1.0 / 24.0 + t * (1.0 / 120.0 + t * poly)))
    return tl.where(small, t + t * t * poly, tl.exp(x) - 1.0)"""

# log(1 + x) (Goldberg): with u = 1 + x rounded, log(u) * x / (u - 1) divides out the
# rounding of u, given an accurate log (Triton's is libdevice's on the GPU); x where u
# rounds to 1. For x >= -1, finite.
LOG1P = """@triton.jit
def log1p(x):
    \"\"\"log(1 + x), accurate also where 1 + x rounds to 1 (x >= -1, finite).\"\"\"
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))"""

HELPERS = {"expm1": EXPM1, "log1p": LOG1P}
_USES = {
    "elu": ("expm1",),
    "selu": ("expm1",),
    "tanh": ("expm1",),
    "softplus": ("log1p",),
    "logsigmoid": ("log1p",),
}


def helpers_for(kind: str) -> dict[str, str]:
    """The helper functions (name -> source) an operator's lines call."""
    return {name: HELPERS[name] for name in _USES.get(kind, ())}


def _num(value: float) -> str:
    """A float literal that Triton reads as fp32 (always with a decimal point)."""
    text = repr(float(value))
    return text if any(c in text for c in ".en") else text + ".0"


def _binary(symbol: str) -> Callable[[Op, list[str], Coords], list[str]]:
    return lambda op, a, _: [f"{op.out} = {a[0]} {symbol} {a[1]}"]


def _call(fn: str) -> Callable[[Op, list[str], Coords], list[str]]:
    return lambda op, a, _: [f"{op.out} = {fn}({', '.join(a)})"]


def _scaled(op: Op, other: str) -> str:
    """add / sub's `alpha * other` (alpha a float32 value, as the parser leaves it)."""
    alpha = op.params.get("alpha", 1.0)
    if alpha == 1.0:
        return other
    literal = float32_literal(alpha)
    return f"({literal}) * {other}" if literal.startswith("-") else f"{literal} * {other}"


def _add_sub(symbol: str) -> Callable[[Op, list[str], Coords], list[str]]:
    return lambda op, a, _: [f"{op.out} = {a[0]} {symbol} {_scaled(op, a[1])}"]


def _lerp(op: Op, a: list[str], _: Coords) -> list[str]:
    # PyTorch's two-sided formula: exact at both ends of the interpolation.
    start, end, weight = a
    return [
        f"{op.out} = tl.where(tl.abs({weight}) < 0.5, {start} + {weight} * ({end} - {start}), "
        f"{end} - ({end} - {start}) * (1.0 - {weight}))"
    ]


def _tanh(op: Op, a: list[str], _: Coords) -> list[str]:
    # tanh(|x|) = -m / (2 + m) with m = expm1(-2|x|) in (-1, 0]: never overflows, and
    # exact near 0, where (1 - exp(-2|x|)) / (1 + exp(-2|x|)) cancels.
    x, m = a[0], f"{op.out}_expm1"
    return [
        f"{m} = expm1(-2.0 * tl.abs({x}))",
        f"{op.out} = -{m} / (2.0 + {m})",
        f"{op.out} = tl.where({x} < 0.0, -{op.out}, {op.out})",
    ]


def _softplus(op: Op, a: list[str], _: Coords) -> list[str]:
    x = a[0]
    beta, threshold = float(op.params["beta"]), float(op.params["threshold"])
    scaled = x if beta == 1.0 else f"({x} * {_num(beta)})"
    stable = f"tl.maximum({scaled}, 0.0) + log1p(tl.exp(-tl.abs({scaled})))"
    if beta != 1.0:
        stable = f"({stable}) / {_num(beta)}"
    return [f"{op.out} = tl.where({scaled} > {_num(threshold)}, {x}, {stable})"]


def _clamp(lo: str | None, hi: str | None, x: str) -> str:
    expr = x
    if lo is not None:
        expr = f"tl.maximum({expr}, {lo})"
    if hi is not None:
        expr = f"tl.minimum({expr}, {hi})"
    return expr


def _triangle(upper: bool) -> Callable[[Op, list[str], Coords], list[str]]:
    def lines(op: Op, a: list[str], coords: Coords) -> list[str]:
        c = coords()
        row, col = c[-2], c[-1]
        diagonal = int(op.params["diagonal"])
        offset = f" - {row}" if diagonal == 0 else f" - {row} - {diagonal}"
        keep = f"{col}{offset} >= 0" if upper else f"{col}{offset} <= 0"
        return [f"{op.out} = tl.where({keep}, {a[0]}, 0.0)"]

    return lines


POINTWISE: dict[str, Callable[[Op, list[str], Coords], list[str]]] = {
    "copy": lambda op, a, _: [f"{op.out} = {a[0]}"],
    "add": _add_sub("+"),
    "sub": _add_sub("-"),
    "mul": _binary("*"),
    "div": _binary("/"),
    "maximum": _call("tl.maximum"),
    "minimum": _call("tl.minimum"),
    "lerp": _lerp,
    "relu": lambda op, a, _: [f"{op.out} = tl.maximum({a[0]}, 0.0)"],
    "leaky_relu": lambda op, a, _: [
        f"{op.out} = tl.where({a[0]} > 0.0, {a[0]}, {a[0]} * {_num(op.params['negative_slope'])})"
    ],
    "sigmoid": _call("tl.sigmoid"),
    "tanh": _tanh,
    "silu": lambda op, a, _: [f"{op.out} = {a[0]} * tl.sigmoid({a[0]})"],
    "gelu": lambda op, a, _: [
        f"{op.out} = 0.5 * {a[0]} * (1.0 + tl.erf({a[0]} * 0.7071067811865476))"
    ],
    "selu": lambda op, a, _: [
        f"{op.out} = {_num(SELU_SCALE)} * tl.where({a[0]} > 0.0, {a[0]}, "
        f"{_num(SELU_ALPHA)} * expm1(tl.minimum({a[0]}, 0.0)))"
    ],
    "hardsigmoid": lambda op, a, _: [
        f"{op.out} = tl.minimum(tl.maximum({a[0]} + 3.0, 0.0), 6.0) / 6.0"
    ],
    "softplus": _softplus,
    "softsign": lambda op, a, _: [f"{op.out} = {a[0]} / (1.0 + tl.abs({a[0]}))"],
    "elu": lambda op, a, _: [
        f"{op.out} = tl.where({a[0]} > 0.0, {a[0]}, "
        f"{_num(op.params['alpha'])} * expm1(tl.minimum({a[0]}, 0.0)))"
    ],
    "hardtanh": lambda op, a, _: [
        f"{op.out} = " + _clamp(_num(op.params["min_val"]), _num(op.params["max_val"]), a[0])
    ],
    "clamp": lambda op, a, _: [
        f"{op.out} = "
        + _clamp(
            None if op.params["min"] is None else _num(op.params["min"]),
            None if op.params["max"] is None else _num(op.params["max"]),
            a[0],
        )
    ],
    "logsigmoid": lambda op, a, _: [
        f"{op.out} = tl.minimum({a[0]}, 0.0) - log1p(tl.exp(-tl.abs({a[0]})))"
    ],
    "cos": _call("tl.cos"),
    "sin": _call("tl.sin"),
    "exp2": _call("tl.exp2"),
    "abs": _call("tl.abs"),
    "triu": _triangle(upper=True),
    "tril": _triangle(upper=False),
}


def pointwise_lines(op: Op, args: list[str], coords: Coords) -> list[str]:
    """Kernel lines computing `op.out` from the registers `args` of its tensor inputs."""
    return POINTWISE[op.kind](op, op.operands(args), coords)
