"""Normalisation without affine weights: layer_norm, group_norm, instance_norm, batch_norm.

LayerNorm, GroupNorm and InstanceNorm all normalise contiguous rows (the last k
dims; a group's channels and positions; one channel's positions), so they share a
row kernel: three sweeps per row (mean, centred variance, normalise), biased
variance, eps inside the square root like PyTorch. BatchNorm in training mode takes
statistics per channel over the batch and positions, which are strided: one program
per channel walks them in contiguous runs.
"""

from __future__ import annotations

from ..codegen import (
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    describe,
    dims_product,
    group_ops,
    kernel_label,
)
from ..fusion import Group
from ..parse import Op
from .layout import RowLayout


def _row_extent(op: Op, x: str, rank: int) -> tuple[str, str]:
    """Host expressions for (number of rows, row length); `x` is the input's host shape."""
    if op.kind == "layer_norm":
        first = rank - op.params["n_dims"]
        return dims_product(x, range(first)), dims_product(x, range(first, rank))
    if op.kind == "instance_norm":
        return dims_product(x, range(2)), dims_product(x, range(2, rank))
    groups = op.params["num_groups"]  # group_norm: a group's channels are contiguous
    return (
        f"{x}[0] * {groups}",
        f"({x}[1] // {groups}) * {dims_product(x, range(2, rank))}",
    )


def _row_norm(module: Module, group: Group, op: Op, rank: int, shape: str) -> KernelBuilder:
    name = op.inputs[0]
    layout = RowLayout(module, *_row_extent(op, module.shape(name), rank))
    doc = f"{'; '.join(describe(o) for o in group_ops(group))}: normalises BLOCK_ROWS rows per program."
    k = module.kernel(kernel_label(group), doc)
    layout.declare(k)
    k.constexpr("EPS", repr(float(op.params["eps"])))

    def load() -> str:
        return module.load_input(k, group, name, "offsets", "mask", "0.0")

    k.line("acc = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)")
    with k.block(layout.loop()):
        layout.chunk(k)
        k.line(f"acc += tl.sum({load()}, axis=1)")
    k.line("mean = acc / n_cols", "acc = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)")
    with k.block(layout.loop()):
        layout.chunk(k)
        x = load()
        k.line(
            f"diff = tl.where(mask, {x} - mean[:, None], 0.0)", "acc += tl.sum(diff * diff, axis=1)"
        )
    k.line("rstd = 1.0 / tl.sqrt(acc / n_cols + EPS)")
    with k.block(layout.loop()):
        layout.chunk(k)
        k.line(f"{op.out} = ({load()} - mean[:, None]) * rstd[:, None]")
        Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([op.out])
    layout.launch(module)
    return k


def _batch_norm(module: Module, group: Group, op: Op, rank: int, shape: str) -> KernelBuilder:
    name = op.inputs[0]
    x_shape = module.shape(name)
    module.host(
        f"n_batch, n_channels = {x_shape}[0], {x_shape}[1]",
        f"n_spatial = {dims_product(x_shape, range(2, rank))}",
    )
    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: one program per channel, "
        "with statistics over the batch and all positions."
    )
    k = module.kernel(kernel_label(group), doc)
    for size in ("n_batch", "n_channels", "n_spatial"):
        k.scalar(size, size)
    k.constexpr("EPS", repr(float(op.params["eps"])))
    k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")
    k.line("channel = tl.program_id(0)", "count = n_batch * n_spatial")

    def sweep() -> str:
        k.line(
            "j = start + tl.arange(0, BLOCK_SIZE)  # (batch, position) pairs of this channel",
            "mask = j < count",
            "offsets = ((j // n_spatial) * n_channels + channel) * n_spatial + j % n_spatial",
        )
        return module.load_input(k, group, name, "offsets", "mask", "0.0")

    k.line("acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)")
    with k.block("for start in range(0, count, BLOCK_SIZE):"):
        k.line(f"acc += {sweep()}")
    k.line("mean = tl.sum(acc, axis=0) / count", "acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)")
    with k.block("for start in range(0, count, BLOCK_SIZE):"):
        k.line(f"diff = tl.where(mask, {sweep()} - mean, 0.0)", "acc += diff * diff")
    k.line("rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / count + EPS)")
    with k.block("for start in range(0, count, BLOCK_SIZE):"):
        k.line(f"{op.out} = ({sweep()} - mean) * rstd")
        Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([op.out])
    module.host(
        "BLOCK_SIZE = min(triton.next_power_of_2(n_batch * n_spatial), 1024)",
        "grid = (n_channels,)",
    )
    return k


def emit(module: Module, group: Group) -> None:
    op = group.anchor
    assert op is not None
    rank = len(module.plan.shapes[op.inputs[0]])
    shape = f"{op.out}_shape"
    module.host(f"{shape} = {module.shape(op.inputs[0])}")
    module.allocate(group.stores, shape)
    build = _batch_norm if op.kind == "batch_norm" else _row_norm
    k = build(module, group, op, rank, shape)
    module.body.extend(k.launch("grid"))
