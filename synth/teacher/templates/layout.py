"""How row-wise kernels (reductions, softmax, scans, normalisation) walk their input.

The input is viewed as contiguous [n_outer, n_reduce, n_inner] around the reduced
dimension. Two static variants keep loads coalesced:

- `RowLayout` (the reduced elements are contiguous: the last dim, or LayerNorm-style
  trailing dims): each program owns BLOCK_ROWS rows and sweeps BLOCK_COLS columns
  per step; threads run along the row.
- `ColumnLayout` (a leading dim): each program owns BLOCK_INNER neighbouring
  positions of one outer index and sweeps BLOCK_R steps of the reduced dim; threads
  run across the contiguous inner positions.

Both loop over the reduced length, so any size works with bounded registers.
"""

from __future__ import annotations

from ..codegen import KernelBuilder, Module, dims_product


class RowLayout:
    axis = 1
    vector = "(BLOCK_ROWS,)"
    tile = "(BLOCK_ROWS, BLOCK_COLS)"
    block = "BLOCK_COLS"
    tile_offsets = "rows"
    tile_mask = "row_mask"
    index = "cols[None, :]"  # position along the reduced dim, per element

    def __init__(self, module: Module, n_rows: str, n_cols: str) -> None:
        module.host(f"n_rows = {n_rows}", f"n_cols = {n_cols}")
        self.length = "n_cols"

    def expand(self, vector: str) -> str:
        return f"{vector}[:, None]"

    def declare(self, k: KernelBuilder) -> None:
        k.scalar("n_rows", "n_rows")
        k.scalar("n_cols", "n_cols")
        k.constexpr("BLOCK_ROWS", "BLOCK_ROWS")
        k.constexpr("BLOCK_COLS", "BLOCK_COLS")
        k.line(
            "pid = tl.program_id(0)",
            "rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)",
            "row_mask = rows < n_rows",
        )

    def loop(self) -> str:
        return "for start in range(0, n_cols, BLOCK_COLS):"

    def chunk(self, k: KernelBuilder) -> None:
        """Inside the loop: `offsets` and `mask` of this step's [BLOCK_ROWS, BLOCK_COLS] tile."""
        k.line(
            "cols = start + tl.arange(0, BLOCK_COLS)",
            "mask = row_mask[:, None] & (cols[None, :] < n_cols)",
            "offsets = rows[:, None] * n_cols + cols[None, :]",
        )

    def reduced_tile(self, k: KernelBuilder) -> tuple[str, str]:
        return "rows", "row_mask"

    def launch(self, module: Module) -> None:
        module.host(
            "BLOCK_COLS = min(triton.next_power_of_2(n_cols), 1024)",
            "BLOCK_ROWS = max(1, min(triton.next_power_of_2(n_rows), 2048 // BLOCK_COLS))",
            "grid = (triton.cdiv(n_rows, BLOCK_ROWS),)",
        )


class ColumnLayout:
    axis = 0
    vector = "(BLOCK_INNER,)"
    tile = "(BLOCK_R, BLOCK_INNER)"
    block = "BLOCK_R"
    index = "r[:, None]"

    def __init__(self, module: Module, shape: str, dim: int, rank: int) -> None:
        module.host(
            f"n_outer = {dims_product(shape, range(dim))}",
            f"n_reduce = {shape}[{dim}]",
            f"n_inner = {dims_product(shape, range(dim + 1, rank))}",
        )
        self.length = "n_reduce"

    def expand(self, vector: str) -> str:
        return f"{vector}[None, :]"

    def declare(self, k: KernelBuilder) -> None:
        for name in ("n_outer", "n_reduce", "n_inner"):
            k.scalar(name, name)
        k.constexpr("BLOCK_R", "BLOCK_R")
        k.constexpr("BLOCK_INNER", "BLOCK_INNER")
        k.line(
            "pid = tl.program_id(0)",
            "inner_blocks = tl.cdiv(n_inner, BLOCK_INNER)",
            "outer = pid // inner_blocks",
            "inner = (pid % inner_blocks) * BLOCK_INNER + tl.arange(0, BLOCK_INNER)",
            "inner_mask = inner < n_inner",
        )

    def loop(self) -> str:
        return "for start in range(0, n_reduce, BLOCK_R):"

    def chunk(self, k: KernelBuilder) -> None:
        """Inside the loop: `offsets` and `mask` of this step's [BLOCK_R, BLOCK_INNER] tile."""
        k.line(
            "r = start + tl.arange(0, BLOCK_R)",
            "mask = (r[:, None] < n_reduce) & inner_mask[None, :]",
            "offsets = (outer * n_reduce + r[:, None]) * n_inner + inner[None, :]",
        )

    def reduced_tile(self, k: KernelBuilder) -> tuple[str, str]:
        k.line("out_offsets = outer * n_inner + inner")
        return "out_offsets", "inner_mask"

    def launch(self, module: Module) -> None:
        module.host(
            "BLOCK_INNER = min(triton.next_power_of_2(n_inner), 128)",
            "BLOCK_R = max(1, min(triton.next_power_of_2(n_reduce), 2048 // BLOCK_INNER))",
            "grid = (n_outer * triton.cdiv(n_inner, BLOCK_INNER),)",
        )


def layout_for(module: Module, shape: str, dim: int, rank: int) -> RowLayout | ColumnLayout:
    """Rows when the reduced dim is the innermost one, columns otherwise (`shape`: host expr)."""
    if dim == rank - 1:
        return RowLayout(module, dims_product(shape, range(rank - 1)), f"{shape}[{dim}]")
    return ColumnLayout(module, shape, dim, rank)
