"""matmul / bmm: a tiled `tl.dot` kernel with broadcast batch dims and a fused epilogue.

One program computes a BLOCK_M x BLOCK_N output tile of one batch entry, walking K in
BLOCK_K steps. Program ids are ordered in groups of GROUP_M row-tiles so neighbouring
programs reuse the same B tiles from L2. Operands in memory are read through their
strides (so transposed views need no copy); an operand computed by a fused prologue is
evaluated at its contiguous offsets instead. Inputs are float32 and the product is exact
float32 (`ieee`): on the H200, `tf32x3` missed atol = rtol = 1e-4 on long reductions
(K ~ 2,000: errors of 2^-11), as plain tf32 would.

On the GPU an `ieee` dot is FMAs in a row along K, so `tl.dot(a, b, acc)` in every step
made each output one chain of K roundings: on 3-D transposed convolutions (`conv` sums
alike; K up to 17k) 5 to 8 times cuDNN's error, past the sandbox's allowance. Each
K block's product is therefore a dot of its own (BLOCK_K terms), added to the running
sum with Kahan compensation (`codegen.compensated_add`): four adds per output element
per BLOCK_K FMAs.
"""

from __future__ import annotations

from ..codegen import (
    Epilogue,
    KernelBuilder,
    Module,
    Tile,
    compensated_add,
    compensated_start,
    describe,
    dot_num_warps,
    group_ops,
    kernel_label,
)
from ..fusion import Group

DOT_PRECISION = "ieee"

# Per operand (by register): (row index, column index, rows, columns).
_OPERANDS = {
    "a": ("offs_m[:, None]", "offs_k[None, :]", "M", "K"),
    "b": ("offs_k[:, None]", "offs_n[None, :]", "K", "N"),
}
_MASKS = {
    "a": "(offs_m[:, None] < M) & (offs_k[None, :] < k_remaining)",
    "b": "(offs_k[:, None] < k_remaining) & (offs_n[None, :] < N)",
}


def _batch_coords(k: KernelBuilder, batch_rank: int) -> list[str]:
    """Decompose the flat batch index into per-dim coordinates (broadcast dims: stride 0)."""
    if not batch_rank:
        return []
    sizes = k.scalars([f"batch_size{d}" for d in range(1, batch_rank)], "batch_shape[1:]")
    k.line("# Batch coordinates, for operands read through (broadcast) batch strides.")
    rest = "batch"
    for d in range(batch_rank - 1, 0, -1):
        k.line(f"batch{d} = {rest} % {sizes[d - 1]}")
        if d > 1:
            k.line(f"batch_rest = {rest} // {sizes[d - 1]}")
            rest = "batch_rest"
        else:
            k.line(f"batch0 = {rest} // {sizes[0]}")
    if batch_rank == 1:
        k.line("batch0 = batch")
    return [f"batch{d}" for d in range(batch_rank)]


def emit(module: Module, group: Group) -> None:
    """Emit the host shapes, the tiled `tl.dot` kernel and its launch for a matmul group."""
    op = group.anchor
    assert op is not None
    names = dict(zip("ab", op.inputs, strict=True))
    fused = {side: name in group.prologues for side, name in names.items()}
    batch_rank = len(module.plan.shapes[op.out]) - 2
    shape = f"{op.out}_shape"
    _host_shapes(module, names, batch_rank, shape)
    module.allocate(group.stores, shape)

    doc = f"{'; '.join(describe(o) for o in group_ops(group))}: one BLOCK_M x BLOCK_N output tile per program."
    k = module.kernel(kernel_label(group), doc)
    for name in ("M", "N", "K"):
        k.scalar(name, name)
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"):
        k.constexpr(name, name)
    _tile_position(k)
    coords = _batch_coords(k, batch_rank) if not all(fused.values()) else []
    k.line(
        "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "offs_k = tl.arange(0, BLOCK_K)",
    )
    steps = {
        side: _operand_addresses(module, k, side, names[side], fused[side], batch_rank, coords)
        for side in _OPERANDS
    }
    compensated_start(k, "(BLOCK_M, BLOCK_N)")
    _k_loop(module, k, group, names, fused, steps)
    _store(module, k, group, op.out, shape, batch_rank, coords)
    _host_launch(module, k, batch_rank)


def _host_shapes(module: Module, names: dict[str, str], batch_rank: int, shape: str) -> None:
    """Host lines for M, K, N and the output `shape` (batch dims broadcast as in PyTorch)."""
    shapes = {side: module.shape(name) for side, name in names.items()}
    module.host(f"M, K = {shapes['a']}[-2:]", f"N = {shapes['b']}[-1]")
    if batch_rank:
        module.needs_math = True
        module.host(
            f"batch_shape = torch.broadcast_shapes({shapes['a']}[:-2], {shapes['b']}[:-2])",
            f"{shape} = (*batch_shape, M, N)",
        )
    else:
        module.host(f"{shape} = (M, N)")


def _tile_position(k: KernelBuilder) -> None:
    """The program's batch entry and (pid_m, pid_n) tile, in grouped order for L2 reuse."""
    k.line(
        "pid = tl.program_id(0)",
        "num_pid_m = tl.cdiv(M, BLOCK_M)",
        "num_pid_n = tl.cdiv(N, BLOCK_N)",
        "tiles_per_matrix = num_pid_m * num_pid_n",
        "batch = pid // tiles_per_matrix",
        "tile = pid % tiles_per_matrix",
        "# Grouped ordering: GROUP_M consecutive row-tiles share the B tiles they read.",
        "group_id = tile // (GROUP_M * num_pid_n)",
        "first_pid_m = group_id * GROUP_M",
        "group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)",
        "pid_m = first_pid_m + (tile % group_rows)",
        "pid_n = (tile % (GROUP_M * num_pid_n)) // group_rows",
    )


def _operand_addresses(
    module: Module,
    k: KernelBuilder,
    side: str,
    name: str,
    fused: bool,
    batch_rank: int,
    coords: list[str],
) -> str:
    """Emit the first K block's offsets (fused) or pointers of operand `side`; return the
    statement that advances them by one K block.

    A stored operand is read through its strides (views need no copy; broadcast batch
    dims have stride 0); a prologue's is contiguous with the output's batch shape.
    """
    rows, cols, n_rows, n_cols = _OPERANDS[side]
    if fused:
        k.line(f"{side}_offsets = batch * {n_rows} * {n_cols} + {rows} * {n_cols} + {cols}")
        return f"{side}_offsets += BLOCK_K" + (" * N" if side == "b" else "")
    tensor = module.tensor(name)
    ptr = k.pointer(tensor)
    row_stride, col_stride = k.scalars(
        [f"stride_{side}{n_rows.lower()}", f"stride_{side}{n_cols.lower()}"],
        f"{tensor}.stride()[-2:]",
    )
    if batch_rank:
        view = f"{tensor}.expand(*batch_shape, {n_rows}, {n_cols})"
        strides = k.scalars(
            [f"stride_{side}_batch{d}" for d in range(batch_rank)], f"{view}.stride()[:-2]"
        )
        offset = " + ".join(f"{c} * {s}" for c, s in zip(coords, strides, strict=True))
        k.line(f"{side}_base = {ptr} + {offset}")
        ptr = f"{side}_base"
    k.line(f"{side}_ptrs = {ptr} + {rows} * {row_stride} + {cols} * {col_stride}")
    stride_k = col_stride if side == "a" else row_stride
    return f"{side}_ptrs += BLOCK_K * {stride_k}"


def _k_loop(
    module: Module,
    k: KernelBuilder,
    group: Group,
    names: dict[str, str],
    fused: dict[str, bool],
    steps: dict[str, str],
) -> None:
    """The loop over K blocks: load both tiles, add their dot compensated, advance."""
    with k.block("for k in range(0, tl.cdiv(K, BLOCK_K)):"):
        k.line("k_remaining = K - k * BLOCK_K")
        for side in "ab":
            if fused[side]:
                k.line(f"{side}_mask = {_MASKS[side]}")
                module.load_input(
                    k, group, names[side], f"{side}_offsets", f"{side}_mask", "0.0", side
                )
            else:
                k.line(f"{side} = tl.load({side}_ptrs, mask={_MASKS[side]}, other=0.0)")
        compensated_add(k, f'tl.dot(a, b, input_precision="{DOT_PRECISION}")')
        k.line(steps["a"], steps["b"])


def _store(
    module: Module,
    k: KernelBuilder,
    group: Group,
    out: str,
    shape: str,
    batch_rank: int,
    coords: list[str],
) -> None:
    """The compensated sum as `out`, run through the group's epilogue and stored.

    The tile's coordinates go to the epilogue when known (for gathers); with a batch
    but no coordinates (both operands fused) the epilogue derives its own.
    """
    k.line(
        f"{out} = acc - carry",
        "out_offsets = batch * M * N + offs_m[:, None] * N + offs_n[None, :]",
        "mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
    )
    tile_coords = (
        coords + ["offs_m[:, None]", "offs_n[None, :]"] if (coords or not batch_rank) else None
    )
    tile = Tile("out_offsets", "mask", shape, batch_rank + 2, tile_coords)
    Epilogue(module, k, group, tile).run([out])


def _host_launch(module: Module, k: KernelBuilder, batch_rank: int) -> None:
    """Host lines choosing the tiles, the grid and warps; then the launch."""
    batches = "math.prod(batch_shape) * " if batch_rank else ""
    # 8 warps from 64 x 32 tiles on: fewer registers a thread and more resident warps than 4.
    module.host(
        "BLOCK_M = max(16, min(64, triton.next_power_of_2(M)))",
        "BLOCK_N = max(16, min(64, triton.next_power_of_2(N)))",
        "BLOCK_K = max(16, min(32, triton.next_power_of_2(K)))",
        "GROUP_M = 8",
        f"grid = ({batches}triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)",
        f"num_warps = {dot_num_warps(2048)}",
    )
    k.options["num_warps"] = "num_warps"
    module.body.extend(k.launch("grid"))
