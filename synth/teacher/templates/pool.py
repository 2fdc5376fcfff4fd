"""avg_pool / max_pool in 1, 2 and 3 dims: one output element per lane.

Each program computes BLOCK_SIZE outputs of the flattened output; for each of them
it walks the window (kernel, stride, padding, dilation are compile-time constants)
and reads the input positions that fall inside the image. Padding counts as zero for
averages (count_include_pad) and never wins a max.
"""

from __future__ import annotations

from contextlib import ExitStack

from ..codegen import (
    Epilogue,
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
    op = group.anchor
    assert op is not None
    p = op.params
    nd, is_max = p["nd"], op.kind.startswith("max")
    name = op.inputs[0]
    x = module.shape(name)
    rank = len(module.plan.shapes[name])
    axes = AXES[nd]
    shape = f"{op.out}_shape"
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
    module.allocate(group.stores, shape)

    doc = (
        f"{'; '.join(describe(o) for o in group_ops(group))}: BLOCK_SIZE outputs per program, "
        "each reduced over its window."
    )
    k = module.kernel(kernel_label(group), doc)
    k.scalar("n_outputs", "n_outputs")
    for a in axes:
        k.scalar(f"in_{a}", f"in_{a}")
    for a in axes:
        k.scalar(f"out_{a}", f"out_{a}")
    for constant in ("KERNEL_SIZE", "STRIDE", "PADDING", "DILATION"):
        k.constexpr(constant, constant.lower())
    k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")
    k.line(
        "pid = tl.program_id(0)",
        "offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
        "mask = offsets < n_outputs",
        "# Output coordinates; `plane` enumerates (batch, channel) pairs.",
    )
    rest = "offsets"
    for i, a in enumerate(reversed(axes)):
        k.line(f"o{a} = {rest} % out_{a}")
        if i < nd - 1:
            k.line(f"position_rest = {rest} // out_{a}")
            rest = "position_rest"
    k.line(f"plane = {rest} // out_{axes[0]}")
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
