"""cumsum / cummax / cummin over one dim: a block scan per step plus a running carry.

Each step scans BLOCK elements of the dim with `tl.cumsum` / `tl.associative_scan`
and combines them with the carry from the previous steps, so any length works.
"""

from __future__ import annotations

from ..codegen import Epilogue, Module, Tile, describe, group_ops, kernel_label
from ..fusion import Group
from .layout import layout_for

COMBINE = {
    "cummax": ("max_combine", "tl.maximum", 'float("-inf")'),
    "cummin": ("min_combine", "tl.minimum", 'float("inf")'),
}


def emit(module: Module, group: Group) -> None:
    op = group.anchor
    assert op is not None
    name = op.inputs[0]
    rank = len(module.plan.shapes[name])
    dim = op.params["dim"]
    shape = f"{op.out}_shape"
    layout = layout_for(module, module.shape(name), dim, rank)
    module.host(f"{shape} = {module.shape(name)}")
    module.allocate(group.stores, shape)

    doc = f"{'; '.join(describe(o) for o in group_ops(group))}, along dim {dim}."
    k = module.kernel(kernel_label(group), doc)
    layout.declare(k)
    axis, vec, ex = layout.axis, layout.vector, layout.expand
    if op.kind == "cumsum":
        k.line(f"carry = tl.zeros({vec}, dtype=tl.float32)  # sum of the previous steps")
    else:
        helper, combine, init = COMBINE[op.kind]
        module.helpers[helper] = f"@triton.jit\ndef {helper}(a, b):\n    return {combine}(a, b)"
        k.line(
            f"carry = tl.full({vec}, {init}, tl.float32)  # running extreme of the previous steps"
        )
    with k.block(layout.loop()):
        layout.chunk(k)
        if op.kind == "cumsum":
            x = module.load_input(k, group, name, "offsets", "mask", "0.0")
            last = f"{layout.index} == start + {layout.block} - 1"
            k.line(
                f"{op.out} = tl.cumsum({x}, axis={axis}) + {ex('carry')}",
                "# The running total is the scan's last position (masked lanes added zeros).",
                f"carry = tl.sum(tl.where({last}, {op.out}, 0.0), axis={axis})",
            )
        else:
            reduce = "tl.max" if op.kind == "cummax" else "tl.min"
            x = module.load_input(k, group, name, "offsets", "mask", init)
            k.line(
                f"{op.out} = {combine}(tl.associative_scan({x}, {axis}, {helper}), {ex('carry')})",
                f"carry = {reduce}({op.out}, axis={axis})",
            )
        Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([op.out])
    layout.launch(module)
    module.body.extend(k.launch("grid"))
