"""Reductions over one dim: sum, mean, max, min, argmax, argmin, var, norm.

Accumulation is in float32, per lane of the tile across BLOCK-sized steps, with one
cross-lane reduction at the end. Sums are compensated (Kahan): a lane of a column
reduction adds thousands of values in a row, and plain float32 there drifted past
PyTorch's own error (a sum over 32,768 rows missed by 7e-4 where 5e-4 was allowed); the
three extra additions per element are free in a memory-bound loop. `var` takes two
passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels
badly; argmax / argmin keep PyTorch's first-index tie-breaking.
"""

from __future__ import annotations

from collections.abc import Callable

from ..codegen import (
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    compensated_add,
    compensated_start,
    describe,
    group_ops,
    kernel_label,
    shape_tuple,
)
from ..fusion import Group
from .layout import ColumnLayout, RowLayout, layout_for

_INIT = {
    "max": 'float("-inf")',
    "min": 'float("inf")',
    "argmax": 'float("-inf")',
    "argmin": 'float("inf")',
}


Load = Callable[[str], str]  # emits the input load with a masked-lane value, returns the register


def _accumulate(k: KernelBuilder, kind: str, layout: RowLayout | ColumnLayout, load: Load) -> str:
    """Emit the reduction loop(s); return the expression of the reduced value.

    Each lane of the tile keeps its own partial result across steps and the tile is
    reduced once after the loop: no cross-lane reduction inside the loop, and
    pairwise-like summation order for accuracy.
    """
    axis, tile, length = layout.axis, layout.tile, layout.length
    if kind in ("sum", "mean", "norm", "var"):
        compensated_start(k, tile)
        with k.block(layout.loop()):
            layout.chunk(k)
            x = load("0.0")
            compensated_add(k, f"{x} * {x}" if kind == "norm" else x)
        k.line(f"total = tl.sum(acc - carry, axis={axis})")
        if kind == "sum":
            return "total"
        if kind == "norm":
            return "tl.sqrt(total)"
        k.line(f"mean = total / {length}")
        if kind == "mean":
            return "mean"
        compensated_start(k, tile)
        with k.block(layout.loop()):
            layout.chunk(k)
            x = load("0.0")
            k.line(f"diff = tl.where(mask, {x} - {layout.expand('mean')}, 0.0)")
            compensated_add(k, "diff * diff")
        return f"tl.sum(acc - carry, axis={axis}) / ({length} - CORRECTION)"
    init = _INIT[kind]
    if kind in ("max", "min"):
        k.line(f"acc = tl.full({tile}, {init}, tl.float32)")
        with k.block(layout.loop()):
            layout.chunk(k)
            x = load(init)
            k.line(f"acc = tl.{kind}imum(acc, {x})")
        return f"tl.{kind}(acc, axis={axis})"
    # argmax / argmin: per lane, the best value and the first position holding it.
    better = ">" if kind == "argmax" else "<"
    k.line(
        f"best = tl.full({tile}, {init}, tl.float32)",
        f"best_index = tl.zeros({tile}, dtype=tl.int32)",
    )
    with k.block(layout.loop()):
        layout.chunk(k)
        x = load(init)
        k.line(
            f"take = {x} {better} best  # strictly: a lane keeps its earliest position on ties",
            f"best = tl.where(take, {x}, best)",
            f"best_index = tl.where(take, {layout.index}, best_index)",
        )
    k.line(
        f"best_value = tl.{kind[3:]}(best, axis={axis})",
        "# The first position holding the best value, as PyTorch breaks ties.",
        f"candidates = tl.where(best == {layout.expand('best_value')}, best_index, {length})",
    )
    return f"tl.min(candidates, axis={axis}).to(tl.float32)"


def emit(module: Module, group: Group) -> None:
    op = group.anchor
    assert op is not None
    name = op.inputs[0]
    x_shape = module.shape(name)
    rank = len(module.plan.shapes[name])
    dim, keepdim = op.params["dim"], op.params["keepdim"]
    out_dims = [f"{x_shape}[{d}]" if d != dim else "1" for d in range(rank)]
    if not keepdim:
        out_dims.pop(dim)
    shape = f"{op.out}_shape"
    layout = layout_for(module, x_shape, dim, rank)
    module.host(f"{shape} = {shape_tuple(out_dims) if out_dims else '()'}")
    module.allocate(group.stores, shape)

    doc = f"{'; '.join(describe(o) for o in group_ops(group))}, over dim {dim} of {op.inputs[0]}."
    k = module.kernel(kernel_label(group), doc)
    layout.declare(k)
    if op.kind == "var":
        k.constexpr("CORRECTION", str(op.params["correction"]))

    def load(other: str) -> str:
        return module.load_input(k, group, name, "offsets", "mask", other)

    value = _accumulate(k, op.kind, layout, load)
    offsets, mask = layout.reduced_tile(k)
    k.line(f"{op.out} = {value}")
    tile = Tile(offsets, mask, shape, len(module.plan.shapes[op.out]))
    Epilogue(module, k, group, tile).run([op.out])
    layout.launch(module)
    module.body.extend(k.launch("grid"))
