"""Sliding-window operators: pooling, convolution and transposed convolution (1d/2d/3d).

Inputs are (batch, channel, spatial...) of rank N + 2; weights are ordinary program
inputs. Kernel, stride, padding, dilation, groups and output padding are single ints
(the same in every spatial dim) drawn from the profile before solving, so the output
size formulas become linear constraints (see `DimSystem.window`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from synth.dims import Atom, DimSystem
from synth.operators.base import (
    Operator,
    ParamContext,
    Params,
    exact_rank,
    pick_divisor,
    template,
)
from synth.operators.call import REQUIRED, Call


def _pinned_kernel(ctx: ParamContext) -> int | None:
    """The kernel size a computed weight already has, if any."""
    if ctx.fixed and len(ctx.fixed) > 1:
        pinned = {ctx.fixed_dim(1, d) for d in range(2, ctx.in_ranks[1])}
        if len(pinned) == 1 and None not in pinned:
            return pinned.pop()
    return None


def _kernel(ctx: ParamContext) -> int:
    """A kernel size from the profile, or the one a computed weight already has."""
    return _pinned_kernel(ctx) or ctx.rng.randint(*ctx.profile.kernel_sizes)


def _stride(ctx: ParamContext) -> int:
    return ctx.rng.randint(*ctx.profile.strides)


def _dilation(ctx: ParamContext) -> int:
    return ctx.rng.randint(*ctx.profile.dilations)


# -- pooling ---------------------------------------------------------------------------------
def _same_size(ctx: ParamContext) -> bool:
    """On retries, sometimes draw a size-preserving window (stride 1, "same" padding): a
    window whose output meets its own input again (x + pool(x)) needs one."""
    return ctx.rng.random() < ctx.leniency() / 2


def _odd_kernel(ctx: ParamContext) -> int:
    lo, hi = ctx.profile.kernel_sizes
    odd = [k for k in range(lo, hi + 1) if k % 2]
    return ctx.rng.choice(odd) if odd else _kernel(ctx)


def _pool_params(dilated: bool):
    def sample(ctx: ParamContext) -> Params:
        if _same_size(ctx):
            k = _odd_kernel(ctx)
            params = {"kernel_size": k, "stride": 1, "padding": k // 2}
            if dilated:
                params["dilation"] = 1
            return params
        k = _kernel(ctx)
        params = {"kernel_size": k, "stride": _stride(ctx), "padding": ctx.rng.randint(0, k // 2)}
        if dilated:
            params["dilation"] = _dilation(ctx)
        return params

    return sample


def _pool_shape(n: int, covers_kernel: bool):
    """Windows over the last `n` dims (a given program may leave out the batch dim).
    `covers_kernel`: PyTorch's avg_pool3d also wants every unpadded spatial dim >= k."""

    def shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
        (x,) = ins
        k, s, p = params["kernel_size"], params["stride"], params["padding"]
        d = params.get("dilation", 1)
        spatial = x[-n:]
        if covers_kernel:
            for size in spatial:
                m.at_least(size, k)
        return [*x[:-n], *(m.window(size, k, s, p, d) for size in spatial)]

    return shape


def _pool_flops(
    ins: Sequence[Sequence[Any]], out: Sequence[Any], params: Params
) -> tuple[int, list[Any]]:
    """One FLOP per window element per output element."""
    return params["kernel_size"] ** (len(out) - 2), list(out)


_POOL_PARAMS = {
    "avg": (
        ("kernel_size", REQUIRED),
        ("stride", None),
        ("padding", 0),
        ("ceil_mode", False),
        ("count_include_pad", True),
    ),
    "max": (
        ("kernel_size", REQUIRED),
        ("stride", None),
        ("padding", 0),
        ("dilation", 1),
        ("ceil_mode", False),
        ("return_indices", False),
    ),
}


def pool(kind: str, n: int) -> Operator:
    dilated = kind == "max"
    extra = ", dilation={dilation}" if dilated else ""
    params = _POOL_PARAMS[kind]
    if kind == "avg" and n > 1:
        params += (("divisor_override", None),)  # avg_pool1d has none
    return Operator(
        name=f"{kind}_pool{n}d",
        group="pooling",
        arity=1,
        rank_rule=exact_rank(n + 2),
        sample_params=_pool_params(dilated),
        shape=_pool_shape(n, covers_kernel=kind == "avg" and n == 3),
        flops=_pool_flops,
        render=template(
            f"F.{kind}_pool{n}d({{0}}, kernel_size={{kernel_size}}, stride={{stride}}, "
            f"padding={{padding}}{extra})"
        ),
        call=Call((f"F.{kind}_pool{n}d",), params=params, ranks=((n + 1, n + 2),)),
    )


# -- convolution -----------------------------------------------------------------------------
def _conv_params(transposed: bool):
    def sample(ctx: ParamContext) -> Params:
        k, s, d = _kernel(ctx), _stride(ctx), _dilation(ctx)
        if _same_size(ctx) and not _pinned_kernel(ctx):
            k, s, d = _odd_kernel(ctx), 1, 1
            params = {"kernel_size": k, "stride": 1, "padding": k // 2, "dilation": 1}
            params["groups"] = pick_divisor(ctx, ctx.profile.conv_groups, ctx.fixed_dim(0, 1))
            if transposed:
                params["output_padding"] = 0
            return params
        params = {
            "kernel_size": k,
            "stride": s,
            "padding": ctx.rng.randint(0, d * (k - 1) // 2),
            "dilation": d,
            "groups": pick_divisor(ctx, ctx.profile.conv_groups, ctx.fixed_dim(0, 1)),
        }
        if transposed:
            params["output_padding"] = ctx.rng.randint(0, max(s, d) - 1)
        return params

    return sample


def _kernel_sizes(m: DimSystem, w: list[Atom], params: Params) -> list[int]:
    """The kernel's size per spatial dim: the drawn `kernel_size` in every dim, or, in a
    given program (known sizes, no `kernel_size`), the weight's own sizes."""
    if "kernel_size" not in params:
        return [m.fixed(kd) for kd in w[2:]]
    k = params["kernel_size"]
    for kd in w[2:]:
        m.unify(kd, m.const(k))
    return [k] * (len(w) - 2)


def _conv_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    """x [N, Cin, s...], w [Cout, Cin/G, k...] -> [N, Cout, o...] (N may be absent)."""
    x, w = ins
    n = len(w) - 2
    g = params["groups"]
    m.unify(w[1], m.split(x[-n - 1], g))
    m.split(w[0], g)  # Cout divisible by groups
    kernel = _kernel_sizes(m, w, params)
    s, p, d = params["stride"], params["padding"], params["dilation"]
    spatial = [m.window(size, k, s, p, d) for size, k in zip(x[-n:], kernel, strict=True)]
    return [*x[: -n - 1], w[0], *spatial]


def _conv_flops(
    ins: Sequence[Sequence[Any]], out: Sequence[Any], params: Params
) -> tuple[int, list[Any]]:
    """2 * |out| * (Cin/G) * k^N."""
    return 2, [*out, *ins[1][1:]]


def _conv_transpose_shape(m: DimSystem, ins: list[list[Atom]], params: Params) -> list[Atom]:
    """x [N, Cin, s...], w [Cin, Cout/G, k...] -> [N, Cout, o...] (N may be absent)."""
    x, w = ins
    n = len(w) - 2
    g = params["groups"]
    m.unify(w[0], x[-n - 1])
    m.split(x[-n - 1], g)  # Cin divisible by groups
    kernel = _kernel_sizes(m, w, params)
    s, p, d, op = params["stride"], params["padding"], params["dilation"], params["output_padding"]
    spatial = [
        m.transposed_window(size, k, s, p, d, op) for size, k in zip(x[-n:], kernel, strict=True)
    ]
    return [*x[: -n - 1], m.scale(w[1], g), *spatial]


def _conv_transpose_flops(
    ins: Sequence[Sequence[Any]], out: Sequence[Any], params: Params
) -> tuple[int, list[Any]]:
    """2 * |x| * (Cout/G) * k^N: every input element meets Cout/G kernels."""
    return 2, [*ins[0], *ins[1][1:]]


_CONV_PARAMS = (("bias", None), ("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))
_CONV_TRANSPOSE_PARAMS = (
    ("bias", None),
    ("stride", 1),
    ("padding", 0),
    ("output_padding", 0),
    ("groups", 1),
    ("dilation", 1),
)


def conv(n: int, transposed: bool = False) -> Operator:
    name = f"conv_transpose{n}d" if transposed else f"conv{n}d"
    if transposed:
        args = (
            "stride={stride}, padding={padding}, output_padding={output_padding}, "
            "groups={groups}, dilation={dilation}"
        )
    else:
        args = "stride={stride}, padding={padding}, dilation={dilation}, groups={groups}"
    return Operator(
        name=name,
        group="convolution",
        arity=2,
        rank_rule=exact_rank(n + 2),
        sample_params=_conv_params(transposed),
        shape=_conv_transpose_shape if transposed else _conv_shape,
        flops=_conv_transpose_flops if transposed else _conv_flops,
        render=template(f"F.{name}({{0}}, {{1}}, {args})"),
        weight_slots=(1,),
        call=Call(
            (f"F.{name}",),
            tensors=("input", "weight"),
            params=_CONV_TRANSPOSE_PARAMS if transposed else _CONV_PARAMS,
            ranks=((n + 1, n + 2), (n + 2, n + 2)),
        ),
    )


OPERATORS: list[Operator] = [
    *(pool("avg", n) for n in (1, 2, 3)),
    *(pool("max", n) for n in (1, 2, 3)),
    *(conv(n) for n in (1, 2, 3)),
    *(conv(n, transposed=True) for n in (1, 2, 3)),
]
