"""Triton expressions for the pointwise operators (elementwise, any broadcasting).

Each entry turns an operator application into kernel lines that assign its output
register from its operand registers. The formulas are chosen to stay accurate in
float32 over the whole input range (no overflowing exponentials in unused `tl.where`
branches, stable softplus/logsigmoid), because the verifier compares with PyTorch
at a tight tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

from ..parse import Op

# Coordinates of the iteration space, by dimension: called only by triu/tril.
Coords = Callable[[], list[str]]

SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805


def _num(value: float) -> str:
    """A float literal that Triton reads as fp32 (always with a decimal point)."""
    text = repr(float(value))
    return text if any(c in text for c in ".en") else text + ".0"


def _binary(symbol: str) -> Callable[[Op, list[str], Coords], list[str]]:
    return lambda op, a, _: [f"{op.out} = {a[0]} {symbol} {a[1]}"]


def _call(fn: str) -> Callable[[Op, list[str], Coords], list[str]]:
    return lambda op, a, _: [f"{op.out} = {fn}({', '.join(a)})"]


def _lerp(op: Op, a: list[str], _: Coords) -> list[str]:
    # PyTorch's two-sided formula: exact at both ends of the interpolation.
    start, end = a[0], a[1]
    weight = a[2] if len(a) > 2 else _num(op.params["weight"])
    return [
        f"{op.out} = tl.where(tl.abs({weight}) < 0.5, {start} + {weight} * ({end} - {start}), "
        f"{end} - ({end} - {start}) * (1.0 - {weight}))"
    ]


def _tanh(op: Op, a: list[str], _: Coords) -> list[str]:
    # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) <= 1: never overflows.
    x, e = a[0], f"{op.out}_exp"
    return [
        f"{e} = tl.exp(-2.0 * tl.abs({x}))",
        f"{op.out} = (1.0 - {e}) / (1.0 + {e})",
        f"{op.out} = tl.where({x} < 0.0, -{op.out}, {op.out})",
    ]


def _softplus(op: Op, a: list[str], _: Coords) -> list[str]:
    x = a[0]
    beta, threshold = float(op.params["beta"]), float(op.params["threshold"])
    scaled = x if beta == 1.0 else f"({x} * {_num(beta)})"
    stable = f"tl.maximum({scaled}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({scaled})))"
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
    "add": _binary("+"),
    "sub": _binary("-"),
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
        f"{_num(SELU_ALPHA)} * (tl.exp(tl.minimum({a[0]}, 0.0)) - 1.0))"
    ],
    "hardsigmoid": lambda op, a, _: [
        f"{op.out} = tl.minimum(tl.maximum({a[0]} + 3.0, 0.0), 6.0) / 6.0"
    ],
    "softplus": _softplus,
    "softsign": lambda op, a, _: [f"{op.out} = {a[0]} / (1.0 + tl.abs({a[0]}))"],
    "elu": lambda op, a, _: [
        f"{op.out} = tl.where({a[0]} > 0.0, {a[0]}, "
        f"{_num(op.params['alpha'])} * (tl.exp(tl.minimum({a[0]}, 0.0)) - 1.0))"
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
        f"{op.out} = tl.minimum({a[0]}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({a[0]})))"
    ],
    "cos": _call("tl.cos"),
    "sin": _call("tl.sin"),
    "exp2": _call("tl.exp2"),
    "abs": _call("tl.abs"),
    "triu": _triangle(upper=True),
    "tril": _triangle(upper=False),
}


def pointwise_lines(op: Op, args: list[str], coords: Coords) -> list[str]:
    """Kernel lines computing `op.out` from the operand registers `args`."""
    return POINTWISE[op.kind](op, args, coords)
