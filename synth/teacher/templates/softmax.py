"""softmax / log_softmax over one dim: an online max-and-sum pass, then a write pass.

The first pass keeps a running maximum and rescales the running sum of exponentials
whenever the maximum grows (no overflow, one read); the second pass writes
exp(x - max) / sum, or x - max - log(sum), with any fused epilogue.
"""

from __future__ import annotations

from ..codegen import Epilogue, Module, Tile, describe, group_ops, kernel_label
from ..fusion import Group
from .layout import layout_for


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

    doc = f"{'; '.join(describe(o) for o in group_ops(group))}, over dim {dim}."
    k = module.kernel(kernel_label(group), doc)
    layout.declare(k)
    axis, vec, ex = layout.axis, layout.vector, layout.expand
    k.line(
        f'row_max = tl.full({vec}, float("-inf"), tl.float32)',
        f"row_sum = tl.zeros({vec}, dtype=tl.float32)",
    )
    with k.block(layout.loop()):
        layout.chunk(k)
        x = module.load_input(k, group, name, "offsets", "mask", 'float("-inf")')
        k.line(
            f"new_max = tl.maximum(row_max, tl.max({x}, axis={axis}))",
            f"row_sum = row_sum * tl.exp(row_max - new_max) + tl.sum(tl.exp({x} - {ex('new_max')}), axis={axis})",
            "row_max = new_max",
        )
    if op.kind == "log_softmax":
        k.line("log_sum = tl.log(row_sum)")
    with k.block(layout.loop()):
        layout.chunk(k)
        x = module.load_input(k, group, name, "offsets", "mask", "0.0")
        if op.kind == "softmax":
            k.line(f"{op.out} = tl.exp({x} - {ex('row_max')}) / {ex('row_sum')}")
        else:
            k.line(f"{op.out} = {x} - {ex('row_max')} - {ex('log_sum')}")
        Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([op.out])
    layout.launch(module)
    module.body.extend(k.launch("grid"))
