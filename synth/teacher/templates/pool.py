"""avg_pool / max_pool in 1, 2 and 3 dims: one output element per lane.

Each program computes BLOCK_SIZE outputs of the flattened output; for each of them
it walks the window (kernel, stride, padding, dilation are compile-time constants)
and reads the input positions that fall inside the image. Padding counts as zero for
averages (count_include_pad) and never wins a max.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from ..codegen import (
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    describe,
    dims_product,
    group_ops,
    kernel_label,
    shape_tuple,
)
from ..fusion import Group

AXES = {1: ["l"], 2: ["h", "w"], 3: ["d", "h", "w"]}


def emit(module: Module, group: Group) -> None:
    """Emit the host sizes, the window-reducing kernel and its launch for a pool group."""
    op = group.anchor
    assert op is not None
    nd, is_max = op.params["nd"], op.kind.startswith("max")
    axes = AXES[nd]
    x = module.shape(op.inputs[0])
    rank = len(module.plan.shapes[op.inputs[0]])
    shape = f"{op.out}_shape"
    _host_sizes(module, op.params, axes, x, rank, shape)
    module.allocate(group.stores, shape)

    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: BLOCK_SIZE outputs per program, "
        "each reduced over its window."
    )
    k = module.kernel(kernel_label(group), doc)
    _declare_arguments(k, axes)
    _output_coordinates(k, axes)
    _reduce_window(module, k, group, op.inputs[0], axes, is_max)
    if is_max:
        k.line(f"{op.out} = acc")
    else:
        window = " * ".join(["KERNEL_SIZE"] * nd)
        k.line(f"{op.out} = acc / ({window})")
    Epilogue(module, k, group, Tile("offsets", "mask", shape, len(module.plan.shapes[op.out]))).run(
        [op.out]
    )
    module.host(
        f"n_outputs = {dims_product(x, range(rank - nd))} * {' * '.join(f'out_{a}' for a in axes)}",
        "BLOCK_SIZE = 256",
        "grid = (triton.cdiv(n_outputs, BLOCK_SIZE),)",
    )
    module.body.extend(k.launch("grid"))


def _host_sizes(
    module: Module, p: dict[str, Any], axes: list[str], x: str, rank: int, shape: str
) -> None:
    """Host lines binding the window parameters, the input and output sizes, and `shape`."""
    nd = len(axes)
    dilation = p.get("dilation", 1)
    module.host(
        f"kernel_size, stride, padding, dilation = {p['kernel_size']}, {p['stride']}, {p['padding']}, {dilation}",
        f"{', '.join(f'in_{a}' for a in axes)}{',' if nd == 1 else ''} = {x}[-{nd}:]",
        *(
            f"out_{a} = (in_{a} + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1"
            for a in axes
        ),
        f"{shape} = {shape_tuple([f'{x}[{d}]' for d in range(rank - nd)] + [f'out_{a}' for a in axes])}",
    )


def _declare_arguments(k: KernelBuilder, axes: list[str]) -> None:
    """Declare the size scalars and constexprs (declaration order is argument order)."""
    k.scalar("n_outputs", "n_outputs")
    for a in axes:
        k.scalar(f"in_{a}", f"in_{a}")
    for a in axes:
        k.scalar(f"out_{a}", f"out_{a}")
    for constant in ("KERNEL_SIZE", "STRIDE", "PADDING", "DILATION"):
        k.constexpr(constant, constant.lower())
    k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")


def _output_coordinates(k: KernelBuilder, axes: list[str]) -> None:
    """Each lane's output element, unravelled into `plane` and one coordinate per axis."""
    k.line(
        "pid = tl.program_id(0)",
        "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
        "mask = offsets < n_outputs",
        "# Output coordinates; `plane` enumerates (batch, channel) pairs.",
    )
    rest = "offsets"
    for i, a in enumerate(reversed(axes)):
        k.line(f"o{a} = {rest} % out_{a}")
        if i < len(axes) - 1:
            k.line(f"position_rest = {rest} // out_{a}")
            rest = "position_rest"
    k.line(f"plane = {rest} // out_{axes[0]}")


def _reduce_window(
    module: Module, k: KernelBuilder, group: Group, name: str, axes: list[str], is_max: bool
) -> None:
    """`acc`: the max or the sum over each lane's window, one nested loop per axis.

    Positions outside the input are masked: they never win a max and add zero to a sum
    (padding counted, as count_include_pad).
    """
    init = (
        'tl.full((BLOCK_SIZE,), float("-inf"), tl.float32)'
        if is_max
        else "tl.zeros((BLOCK_SIZE,), dtype=tl.float32)"
    )
    k.line(f"acc = {init}")
    inside, address = "mask", "plane"
    with ExitStack() as loops:
        for a in axes:  # one loop per spatial axis of the window
            loops.enter_context(k.block(f"for k{a} in range(KERNEL_SIZE):"))
            k.line(
                f"x{a} = o{a} * STRIDE - PADDING + k{a} * DILATION",
                f"valid_{a} = {inside} & (x{a} >= 0) & (x{a} < in_{a})",
            )
            inside = f"valid_{a}"
            address = f"({address} * in_{a} + x{a})"
        other = 'float("-inf")' if is_max else "0.0"
        k.line(f"x_offsets = {address[1:-1]}")
        x_value = module.load_input(k, group, name, "x_offsets", inside, other)
        k.line(f"acc = tl.maximum(acc, {x_value})" if is_max else f"acc += {x_value}")
