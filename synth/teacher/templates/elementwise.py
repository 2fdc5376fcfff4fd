"""Elementwise kernels: a chain of pointwise/gather operators over one iteration shape.

Pointwise chains (the common case) run over *merged* dims: at run time the host
merges adjacent output dims that every operand walks alike (`merge_dims`), so a
same-shape contiguous chain is one flat dim and a broadcast one usually two or three.
The kernel sees the merged shape as [n_rows, n_cols] (n_cols: the innermost merged
dim) and each program owns a BLOCK_ROWS x BLOCK_COLS tile: operands are addressed
as `row offset + cols * stride`, where a row's coordinates in the outer merged dims
are split once per row, never per element (integer division is what bound these
kernels on GPUs, not memory). Offsets are 32-bit unless the output is too large.

Groups with gather operators (cat, stack, a materialised transpose) or triu/tril need
coordinates in the output's own dims: one program handles BLOCK_SIZE consecutive
output elements and every operand is read through the strides of its expanded view.
"""

from __future__ import annotations

import inspect

from ..codegen import (
    INDENT,
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    describe,
    kernel_label,
    shape_tuple,
    wrap_call,
)
from ..fusion import GATHER_KINDS, Group
from ..parse import Op

BLOCK_SIZE = 1024  # gather groups: elements per program
TILE = 4096  # merged groups: elements per program (several per thread, so loads vectorise)
MAX_BLOCK_COLS = 1024  # wider rows split into column blocks (bounds the masked tail of a row)
NUM_WARPS = 4  # 32 elements a thread: on the H200 as fast as 8 warps, faster for scattered reads
# One merged dim (a same-shape chain) streams: 4 elements a thread in 8 warps reached eager
# PyTorch's copy bandwidth on 2^30 elements of an H200 (1.00x); 4,096-element tiles 0.96x.
FLAT_BLOCK = 1024
FLAT_NUM_WARPS = 8
# Offsets stay 32-bit while every offset a program forms (tails included) fits.
INDEX_32_LIMIT = f"2**31 - {TILE}"
# Operators that need coordinates of the output's own dims.
COORDINATE_KINDS = GATHER_KINDS | {"triu", "tril"}


def merge_dims(
    shape: tuple[int, ...], *strides: tuple[int, ...]
) -> tuple[int, list[int], list[list[int]]]:
    """Merge adjacent dims that every operand walks alike, so kernels split indices less.

    Dims d-1 and d merge when, for each operand, stride[d-1] == stride[d] * shape[d]
    (contiguous across the pair, or broadcast across it: both strides 0); size-1 dims
    are dropped (their only index is 0). Returns the merged rank and the merged sizes
    and per-operand strides, padded in front with size-1 dims (stride 0) to the
    kernel's fixed rank, max(len(shape), 1).
    """
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if sizes and all(m[-1] == s[d] * size for m, s in zip(merged, strides, strict=True)):
            sizes[-1] *= size
            for m, s in zip(merged, strides, strict=True):
                m[-1] = s[d]
        else:
            sizes.append(size)
            for m, s in zip(merged, strides, strict=True):
                m.append(s[d])
    pad = max(len(shape), 1) - len(sizes)
    return max(len(sizes), 1), [1] * pad + sizes, [[0] * pad + m for m in merged]


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
    module.host(f"{shape} = {output_shape(module, first)}")
    module.allocate(group.stores, shape)
    doc = "Elementwise " + "; ".join(describe(op) for op in group.ops) + "."  # never has a prologue
    k = module.kernel(kernel_label(group), doc)
    if any(op.kind in COORDINATE_KINDS for op in group.ops):
        _emit_flat(module, group, k, shape)
    else:
        _emit_merged(module, group, k, shape)


def _emit_merged(module: Module, group: Group, k: KernelBuilder, shape: str) -> None:
    """Pointwise chain over the dims the host merged, one row/column tile per program."""
    rank = max(len(group.shape), 1)  # slots: rank - 1 outer (row) dims, then the column dim
    k.scalar("n_rows", "n_rows")
    k.scalar("n_cols", "col_end")
    k.scalar("col_start", "col_start")
    sizes = k.scalars([f"size{d}" for d in range(1, rank - 1)], "sizes[1:-1]")
    rows, cols = k.constexpr("BLOCK_ROWS", "BLOCK_ROWS"), k.constexpr("BLOCK_COLS", "BLOCK_COLS")
    ndim = k.constexpr("NDIM", "ndim")
    index_64 = k.constexpr("INDEX_64", "index_64")
    k.options["num_warps"] = "num_warps"
    k.line("pid = tl.program_id(0)")
    with k.block(f"if {index_64}:"):
        k.line("pid = pid.to(tl.int64)")
    with k.block(f"if {ndim} == 1:  # one merged dim: plain flat offsets, no index split"):
        k.line("rows = 0", f"cols = col_start + pid * {cols} + tl.arange(0, {cols})[None, :]")
    with k.block("else:"):
        k.line(
            f"col_blocks = tl.cdiv(n_cols, {cols})",
            f"rows = (pid // col_blocks) * {rows} + tl.arange(0, {rows})[:, None]",
            f"cols = (pid % col_blocks) * {cols} + tl.arange(0, {cols})[None, :]",
        )
    k.line("mask = (rows < n_rows) & (cols < n_cols)", "offsets = rows * n_cols + cols")
    coords = [f"idx{d}" for d in range(rank - 1)]
    if coords:
        k.line("# Coordinates of each row in the outer merged dims: split once per row.")
        k.line(*(f"{c} = 0" for c in coords[:-1]), f"{coords[-1]} = rows")
    for d in range(rank - 2, 0, -1):  # merged dim d exists when NDIM > rank - d
        with k.block(f"if {ndim} > {rank - d}:"):
            k.line(
                f"{coords[d - 1]} = {coords[d]} // {sizes[d - 1]}",
                f"{coords[d]} = {coords[d]} % {sizes[d - 1]}",
            )
    tile = Tile("offsets", "mask", shape, rank, coords + ["cols"], merged=True)
    epilogue = Epilogue(module, k, group, tile)
    epilogue.run([])
    strides = [f"{t}.expand({shape}).stride()" for t in epilogue.operands]
    names = [f"{t}_strides" for t in epilogue.operands]
    targets = f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})" if names else "_"
    module.comment(
        "Merge the dims every operand walks alike (at run time: any shapes work), so the "
        "kernel splits its indices into as few coordinates as possible."
    )
    module.body.extend(
        wrap_call(f"ndim, sizes, {targets} = merge_dims", [shape, *strides], "", INDENT)
    )
    module.helpers.setdefault("merge_dims", inspect.getsource(merge_dims).rstrip())
    module.needs_math = True
    module.host(
        "n_rows, n_cols = math.prod(sizes[:-1]), sizes[-1]",
        f"BLOCK_COLS = max(1, min(triton.next_power_of_2(n_cols), {_cols_cap()}))",
        f"BLOCK_ROWS = max(1, min(triton.next_power_of_2(n_rows), {TILE} // BLOCK_COLS))",
        f"num_warps = {FLAT_NUM_WARPS} if ndim == 1 else {NUM_WARPS}",
        f"index_64 = n_rows * n_cols > {INDEX_32_LIMIT}  # 32-bit offsets while they fit",
    )
    module.comment(
        "Flat: the full blocks first, then the ragged end. Bounded by a multiple of 16, the "
        "mask is provably constant over each 4 lanes, so loads and stores move 128 bits at a "
        "time (an odd bound makes every access scalar)."
    )
    module.host(
        "n_full = n_cols - n_cols % BLOCK_COLS if ndim == 1 else n_cols",
        "for col_start, col_end in ((0, n_full), (n_full, n_cols)):",
        f"{INDENT}if col_end > col_start:",
        f"{INDENT * 2}n_col_blocks = triton.cdiv(col_end - col_start, BLOCK_COLS)",
        f"{INDENT * 2}grid = (triton.cdiv(n_rows, BLOCK_ROWS) * n_col_blocks,)",
    )
    module.body.extend(k.launch("grid", indent=INDENT * 3))


def _cols_cap() -> str:
    """The host expression of a tile's widest row: flat (NDIM 1) or a row of a 2-D tile."""
    if FLAT_BLOCK == MAX_BLOCK_COLS:
        return str(FLAT_BLOCK)
    return f"{FLAT_BLOCK} if ndim == 1 else {MAX_BLOCK_COLS}"


def _emit_flat(module: Module, group: Group, k: KernelBuilder, shape: str) -> None:
    """Gather/triangle groups: BLOCK_SIZE consecutive output elements per program."""
    n_elements = k.scalar("n_elements", "n_elements")
    block = k.constexpr("BLOCK_SIZE", "BLOCK_SIZE")
    index_64 = k.constexpr("INDEX_64", "index_64")
    k.line("pid = tl.program_id(0)")
    with k.block(f"if {index_64}:"):
        k.line("pid = pid.to(tl.int64)")
    k.line(f"offsets = pid * {block} + tl.arange(0, {block})", f"mask = offsets < {n_elements}")
    Epilogue(module, k, group, Tile("offsets", "mask", shape, len(group.shape))).run([])
    module.host(
        f"n_elements = {group.stores[0]}.numel()",
        f"BLOCK_SIZE = {BLOCK_SIZE}",
        "grid = (triton.cdiv(n_elements, BLOCK_SIZE),)",
        f"index_64 = n_elements > 2**31 - {BLOCK_SIZE}  # 32-bit offsets while they fit",
    )
    module.body.extend(k.launch("grid"))
