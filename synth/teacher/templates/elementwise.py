"""Elementwise kernels: a chain of pointwise/gather operators over one iteration shape.

One program handles BLOCK_SIZE consecutive output elements; operands with the output's
shape are read with the same contiguous offsets (coalesced), broadcast or transposed
operands through the strides of their expanded view (stride 0 along broadcast dims).
"""

from __future__ import annotations

from ..codegen import Epilogue, Module, Tile, describe, kernel_label, shape_tuple
from ..fusion import Group
from ..parse import Op

BLOCK_SIZE = 1024


def output_shape(module: Module, op: Op) -> str:
    """Host expression for the shape of the first operator of an elementwise group."""
    names = [module.tensor(name) for name in op.inputs]
    rank = len(module.plan.shapes[op.out])
    if op.kind == "cat":
        dim = op.params["dim"]
        a, b = names
        return shape_tuple(
            [
                f"{a}.shape[{d}]" if d != dim else f"{a}.shape[{d}] + {b}.shape[{d}]"
                for d in range(rank)
            ]
        )
    if op.kind == "stack":
        dim = op.params["dim"]
        dims = [f"{names[0]}.shape[{d}]" for d in range(rank - 1)]
        return shape_tuple(dims[:dim] + ["2"] + dims[dim:])
    if op.kind == "transpose":
        x = names[0]
        return shape_tuple(
            [f"{x}.shape[{d}]" for d in range(rank - 2)] + [f"{x}.shape[-1]", f"{x}.shape[-2]"]
        )
    if len(names) == 1:
        return f"{names[0]}.shape"
    return f"torch.broadcast_shapes({', '.join(f'{n}.shape' for n in names)})"


def emit(module: Module, group: Group) -> None:
    first = group.ops[0]
    shape = f"{first.out}_shape"
    rank = len(group.shape)
    module.host(f"{shape} = {output_shape(module, first)}")
    module.allocate(group.stores, shape)
    doc = "Elementwise " + "; ".join(describe(op) for op in group.ops) + "."  # never has a prologue
    k = module.kernel(kernel_label(group), doc)
    n_elements = k.scalar("n_elements", "n_elements")
    block = k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")
    k.line(
        "pid = tl.program_id(0)",
        f"offsets = pid * {block} + tl.arange(0, {block})",
        f"mask = offsets < {n_elements}",
    )
    Epilogue(module, k, group, Tile("offsets", "mask", shape, rank)).run([])
    module.host(
        f"n_elements = {group.stores[0]}.numel()",
        f"BLOCK_SIZE = {BLOCK_SIZE}",
        "grid = (triton.cdiv(n_elements, BLOCK_SIZE),)",
    )
    module.body.extend(k.launch("grid"))
