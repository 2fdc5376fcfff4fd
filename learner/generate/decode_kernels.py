"""Pallas (Triton) kernels for a decode step with few token rows: 5-6 kernels a layer, not ~15.

At batch 1 a decode step is bound by kernel launches, not bytes: XLA:GPU turns every
matrix-vector product and every RMSNorm into reduction kernels of their own and writes the KV
cache in separate dynamic-update-slices. Here one kernel does each of

1. `qkv_rope`: RMSNorm statistics + the QKV projection + bias + RoPE;
2. `attention`: the new token over the KV cache, writing its key and value into the cache
   (with a small combine kernel when the cache length is split across programs);
3. `matvec_residual`: o_proj (and, again, down) + the residual add;
4. `gate_up_silu`: RMSNorm statistics + gate/up projection + silu(gate) * up;

and `rms_norm` the final norm once a step. The QKV kernel makes each row's RoPE angles from
its position and attention makes its mask from each row's start, so no XLA kernel a step
prepares them.

Weights are [out, in] (the contracted dimension last and contiguous) with any RMSNorm scale
already folded in (`decode.DecodeLayerWeights`), so a kernel reads the residual itself and
scales its dot products by 1 / rms: each program recomputes that from the `hidden`-long row.
Dot products accumulate in float32 and round where the XLA path (`decode._fused_layer`) rounds.

Matrix-vector kernels grid over blocks of output rows (enough programs to fill the SMs of an
H100/H200) and loop over the contracted dimension in chunks of up to 8,192, loading a
contiguous [rows, chunk] tile of the weight per step; token rows are an unrolled loop that
reuses the tile. Any size works: loads and stores are masked where a block overhangs.
Every kernel function takes its block sizes, Triton's `num_warps` / `num_stages` and the
kernel's name in profiles (`bench.decode_kernel_sweep` times each setting on the GPU by
that name). The sampler picks these kernels on its own only where they beat XLA's
(`decode.uses_pallas`).
Off the GPU the kernels run in Pallas' interpreter (`interpret=None` picks it). Static indices
into refs are numpy integers: the interpreter's load and store rules reject Python ints.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Token rows (batch x new tokens) up to which the kernels are meant to run: each row is an
# unrolled pass over a weight tile already in registers; larger batches are GEMMs, XLA's job.
MAX_ROWS = 8

_NEG_INF = -0.7 * float(jnp.finfo(jnp.float32).max)  # as qwen2 masks scores: finite
_TILE = 8192  # weight elements a program holds per loop step (16 KiB of bf16)
_MAX_BLOCK_K = 8192
_MIN_BLOCK_N = 2  # rows a program sweeps at least, also when a whole row fills the tile
# Rows of gate (and as many of up) a gate-up program sweeps: the fastest of 1-16 for
# Qwen2-0.5B on an H200 (1.07x of the 4 the tile budget gives), and that budget's own
# choice at 1.5B.
_GATE_UP_BLOCK_N = 2
_MIN_PROGRAMS = 128  # about one per SM of an H100 / H200 (132)
# QKV programs: two a SM. Qwen2-0.5B's QKV on an H200 ran 1.10x faster as 288 programs of
# 2 dimension pairs (2 warps) than as 144 of 4 (`bench.decode_kernel_sweep`); larger models
# reach this count with the tile budget's own block.
_QKV_MIN_PROGRAMS = 256
# Split the cache length until about this many attention programs, shortening the chunks
# (down to _MIN_BLOCK_S slots) where the cache has too few: Qwen2-0.5B's attention at one row
# ran 1.14x faster as 96 programs of 32 slots than as 48 of 64 on an H200
# (`bench.decode_kernel_sweep`, the combine included).
_ATTENTION_PROGRAMS = 96
_MAX_BLOCK_S = 64
_MIN_BLOCK_S = 32
_NUM_WARPS = 4
# Warps of a one-row program whose weight tiles fill at most half the budget (`_TILE // 2`
# elements, as Qwen2-0.5B's 896-wide rows do), the fastest measured per kernel on an H200
# (`bench.decode_kernel_sweep`: QKV 1.10x with 2 warps, gate-up 1.07x with 1, against 4).
# Fuller tiles (1.5B and up) and more rows (more arithmetic a program) keep `_NUM_WARPS`.
_HALF_TILE_WARPS = {"qkv": 2, "gate_up": 1}
# A one-row matvec whose rows pad to the tile budget or more and are not a power of two (the
# down projections: 4,864, 8,960 and 18,944 wide) contracts one whole row a program in
# exact spans (`_pieces`) on 8 warps: 1.05x, 1.20x and 1.05x of two rows in 8,192-wide
# masked chunks at 0.5B, 1.5B and 7B on an H100 (`bench.decode_kernel_sweep`); two rows
# lose (0.87x at 0.5B), so they keep the chunks.
_WIDE_ROW_WARPS = 8

Ref = Any  # a Pallas reference to a kernel operand (Triton: a pointer)


def _pow2(n: int) -> int:
    """The smallest power of two >= n (Triton block shapes must be powers of two)."""
    return 1 << max(0, n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _interpret(interpret: bool | None) -> bool:
    return jax.default_backend() != "gpu" if interpret is None else interpret


def _params(num_warps: int, num_stages: int) -> plgpu.CompilerParams:
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _and(a: jax.Array | None, b: jax.Array | None) -> jax.Array | None:
    """Conjunction of two masks, where None means "all true" (no mask needed)."""
    if a is None or b is None:
        return b if a is None else a
    return a & b


def _tile_mask(rows_ok: jax.Array | None, cols_ok: jax.Array | None) -> jax.Array | None:
    """The [rows, cols] mask of a tile from its rows' and columns' masks (None: all valid)."""
    return _and(
        None if rows_ok is None else rows_ok[:, None], None if cols_ok is None else cols_ok[None, :]
    )


def _load(ref: Ref, mask: jax.Array | None, other: float = 0) -> jax.Array:
    """A load, masked (with `other` where the mask is off) only when there is a mask."""
    if mask is None:
        return plgpu.load(ref)
    return plgpu.load(ref, mask=mask, other=other)


def _warps(kernel: str, tile: int, rows: int) -> int:
    """Triton warps for a program of `kernel` holding `tile` weight elements a step."""
    return _HALF_TILE_WARPS[kernel] if rows == 1 and tile <= _TILE // 2 else _NUM_WARPS


def _wide_row(rows: int, k: int) -> bool:
    """Whether a matvec over rows of width k takes one exact-span row a program."""
    return rows == 1 and _pow2(k) >= _TILE and k != _pow2(k)


def _pieces(k: int, minimum: int = 16) -> list[tuple[int, int]]:
    """(offset, size) spans of power-of-two sizes, largest first, that cover k exactly (the
    last rounded up to `minimum` and masked): 4,864 is 4,096 + 512 + 256, not one 8,192-wide
    tile 40% of which is masked but still holds registers."""
    padded = _cdiv(k, minimum) * minimum
    spans, offset = [], 0
    for bit in reversed(range(padded.bit_length())):
        if padded >> bit & 1:
            spans.append((offset, 1 << bit))
            offset += 1 << bit
    return spans


def _matvec_blocks(
    n: int,
    k: int,
    tiles: int,
    block_n: int | None,
    block_k: int | None,
    min_programs: int = _MIN_PROGRAMS,
) -> tuple[int, int]:
    """Block sizes of a matrix-vector kernel over `n` outputs contracting `k`.

    block_k: the whole row when it fits (fewest loop steps, most bytes in flight), else 8,192.
    block_n: as many rows as the tile budget allows (`tiles` weight tiles per program), at
    least two, halved until there are `min_programs` (about as many as SMs). Qwen2-0.5B's down
    projection (4,864-wide rows) ran 1.33x faster on an H200 as 2 whole rows a program than
    as 4 rows of 2,048-wide steps (`bench.decode_kernel_sweep`).
    """
    if block_k is None:
        block_k = min(_pow2(k), _MAX_BLOCK_K)
    if block_n is None:
        block_n = min(max(_MIN_BLOCK_N, _TILE // (tiles * block_k)), _pow2(n))
        while block_n > 1 and _cdiv(n, block_n) < min_programs:
            block_n //= 2
    for name, size in (("block_n", block_n), ("block_k", block_k)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"{name}={size} must be a power of two")
    return block_n, block_k


def _dot_rows(
    x_ref: Ref,
    w_ref: Ref,
    starts: Sequence[jax.Array],
    row_ok: jax.Array | None,
    *,
    rows: int,
    k: int,
    block_n: int,
    block_k: int,
    with_norm: bool,
    first_step: jax.Array | int = 0,
    steps: int | None = None,
    ragged: bool | None = None,
    pieces: bool = False,
) -> tuple[list[list[jax.Array]], list[jax.Array] | None]:
    """Float32 dot products of weight rows [start, start + block_n) with each row of x [R, k].

    Returns acc[r][i] ([block_n], for row r of x and block i of `starts`) and, with
    `with_norm`, the sum of squares of each row of x (the RMSNorm statistics, free here: the
    kernel reads x anyway). The weight tiles are loaded once a step and reused by every row.
    `first_step` and `steps` restrict the sum to that run of `block_k` chunks (a split of the
    contracted dimension); `ragged` says whether any program's chunks overhang `k` (then they
    are masked, and chunks wholly past it read nothing). `pieces`: one pass over the whole
    row in `_pieces` spans instead of `block_k` chunks (all loads issued before any sum).
    """
    if pieces:
        return _dot_row_pieces(
            x_ref,
            w_ref,
            starts,
            row_ok,
            rows=rows,
            k=k,
            block_n=block_n,
            with_norm=with_norm,
        )
    if steps is None:
        steps = _cdiv(k, block_k)
    k_tail = k % block_k != 0 if ragged is None else ragged
    f32 = jnp.float32

    def step(i: jax.Array, carry: tuple) -> tuple:
        accs, ssqs = carry
        k0 = pl.multiple_of((first_step + i) * block_k, block_k)
        k_ok = (k0 + jnp.arange(block_k) < k) if k_tail else None
        tile_ok = _tile_mask(row_ok, k_ok)
        tiles = [
            _load(w_ref.at[pl.ds(s, block_n), pl.ds(k0, block_k)], tile_ok).astype(f32)
            for s in starts
        ]
        xs = [_load(x_ref.at[np.int32(r), pl.ds(k0, block_k)], k_ok) for r in range(rows)]
        new_accs, new_ssqs = [], []
        for r in range(rows):
            xr = xs[r].astype(f32)
            new_accs.append(
                tuple(
                    a + jnp.sum(t * xr[None, :], axis=1)
                    for a, t in zip(accs[r], tiles, strict=True)
                )
            )
            if with_norm:
                new_ssqs.append(ssqs[r] + jnp.sum(xr * xr))
        return tuple(new_accs), tuple(new_ssqs)

    zeros = tuple(tuple(jnp.zeros((block_n,), f32) for _ in starts) for _ in range(rows))
    ssq0 = tuple(jnp.zeros((), f32) for _ in range(rows)) if with_norm else ()
    if steps == 1:  # straight-line code: the epilogue's loads can be scheduled beside it
        accs, ssqs = step(jnp.int32(0), (zeros, ssq0))
    else:
        accs, ssqs = jax.lax.fori_loop(0, steps, step, (zeros, ssq0))
    return [list(a) for a in accs], (list(ssqs) if with_norm else None)


def _dot_row_pieces(
    x_ref: Ref,
    w_ref: Ref,
    starts: Sequence[jax.Array],
    row_ok: jax.Array | None,
    *,
    rows: int,
    k: int,
    block_n: int,
    with_norm: bool,
) -> tuple[list[list[jax.Array]], list[jax.Array] | None]:
    """`_dot_rows` over the whole contracted dimension in exact power-of-two spans."""
    f32 = jnp.float32
    spans = []
    for start, size in _pieces(k):
        k_ok = (start + jnp.arange(size) < k) if start + size > k else None
        # A traced offset: the interpreter refuses a static slice that overhangs, masked or not.
        offset = pl.multiple_of(jnp.int32(start) + pl.program_id(0) * 0, size)
        tile_ok = _tile_mask(row_ok, k_ok)
        tiles = [_load(w_ref.at[pl.ds(s, block_n), pl.ds(offset, size)], tile_ok) for s in starts]
        xs = [_load(x_ref.at[np.int32(r), pl.ds(offset, size)], k_ok) for r in range(rows)]
        spans.append((tiles, xs))
    accs = [[jnp.zeros((block_n,), f32) for _ in starts] for _ in range(rows)]
    ssqs = [jnp.zeros((), f32) for _ in range(rows)]
    for tiles, xs in spans:
        for r, x in enumerate(xs):
            xr = x.astype(f32)
            for i, tile in enumerate(tiles):
                accs[r][i] = accs[r][i] + jnp.sum(tile.astype(f32) * xr[None, :], axis=1)
            if with_norm:
                ssqs[r] = ssqs[r] + jnp.sum(xr * xr)
    return accs, (ssqs if with_norm else None)


# --------------------------------------------------------------------------------------------
# Matrix-vector product + residual (o_proj, down)
# --------------------------------------------------------------------------------------------


def _matvec_residual_kernel(
    x_ref: Ref,
    w_ref: Ref,
    res_ref: Ref,
    o_ref: Ref,
    *,
    rows: int,
    n: int,
    k: int,
    block_n: int,
    block_k: int,
    pieces: bool,
) -> None:
    n0 = pl.multiple_of(pl.program_id(0) * block_n, block_n)
    n_ok = (n0 + jnp.arange(block_n) < n) if n % block_n else None
    # Loaded first: its round trip overlaps the weights' instead of following it.
    residuals = [_load(res_ref.at[np.int32(r), pl.ds(n0, block_n)], n_ok) for r in range(rows)]
    accs, _ = _dot_rows(
        x_ref,
        w_ref,
        [n0],
        n_ok,
        rows=rows,
        k=k,
        block_n=block_n,
        block_k=block_k,
        with_norm=False,
        pieces=pieces,
    )
    for r, res in enumerate(residuals):
        y = res + accs[r][0].astype(res.dtype)
        plgpu.store(o_ref.at[np.int32(r), pl.ds(n0, block_n)], y, mask=n_ok)


def _matvec_partial_kernel(
    x_ref: Ref,
    w_ref: Ref,
    o_ref: Ref,
    *,
    rows: int,
    n: int,
    k: int,
    block_n: int,
    block_k: int,
    chunks: int,
    splits: int,
) -> None:
    """One split of the contracted dimension: float32 partial sums [rows, block_n]."""
    n0 = pl.multiple_of(pl.program_id(0) * block_n, block_n)
    split = pl.program_id(1)
    n_ok = (n0 + jnp.arange(block_n) < n) if n % block_n else None
    accs, _ = _dot_rows(
        x_ref,
        w_ref,
        [n0],
        n_ok,
        rows=rows,
        k=k,
        block_n=block_n,
        block_k=block_k,
        with_norm=False,
        first_step=split * chunks,
        steps=chunks,
        ragged=splits * chunks * block_k != k,
    )
    for r in range(rows):
        plgpu.store(o_ref.at[split, np.int32(r), pl.ds(n0, block_n)], accs[r][0], mask=n_ok)


def _split_sum_kernel(
    p_ref: Ref, res_ref: Ref, o_ref: Ref, *, rows: int, n: int, splits: int, block_n: int
) -> None:
    """residual + the sum of the splits' partials, rounded once as the unsplit kernel does."""
    n0 = pl.multiple_of(pl.program_id(0) * block_n, block_n)
    block_p = _pow2(splits)
    p_ok = (jnp.arange(block_p) < splits) if block_p != splits else None
    n_ok = (n0 + jnp.arange(block_n) < n) if n % block_n else None
    pn_ok = _tile_mask(p_ok, n_ok)
    for r in range(rows):
        parts = _load(p_ref.at[pl.ds(0, block_p), np.int32(r), pl.ds(n0, block_n)], pn_ok)
        res = _load(res_ref.at[np.int32(r), pl.ds(n0, block_n)], n_ok)
        y = res + jnp.sum(parts, axis=0).astype(res.dtype)
        plgpu.store(o_ref.at[np.int32(r), pl.ds(n0, block_n)], y, mask=n_ok)


def matvec_residual(
    x: jax.Array,
    w: jax.Array,
    residual: jax.Array,
    *,
    block_n: int | None = None,
    block_k: int | None = None,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int = 1,
    splits: int = 1,
    pieces: bool | None = None,
    name: str | None = None,
) -> jax.Array:
    """residual + x @ w.T for x [R, k], w [n, k], residual [R, n]; in residual's dtype.

    The product rounds to residual's dtype before the add, as `x + einsum(...)` does in XLA.
    `splits` > 1 divides the contracted dimension among that many programs per block of
    outputs (more bytes in flight where n alone gives few programs), and a second small
    kernel (`<name>_combine`) adds their float32 partials to the residual.
    `pieces=True` contracts each row in one pass of exact power-of-two spans (`_pieces`)
    instead of `block_k`-wide chunks, so a row like 4,864 holds no masked registers.
    `pieces=None` does so, one row a program on 8 warps, for one token row and rows that pad
    to the tile budget or more (`_wide_row`: the down projections), where it measured faster,
    unless `block_k` or `splits` ask for chunks.
    """
    rows, k = x.shape
    n = w.shape[0]
    if splits < 1:
        raise ValueError(f"splits={splits} must be >= 1")
    if pieces is None:
        pieces = splits == 1 and block_k is None and _wide_row(rows, k)
        if pieces:
            block_n = 1 if block_n is None else block_n
            num_warps = _WIDE_ROW_WARPS if num_warps is None else num_warps
    if num_warps is None:
        num_warps = _NUM_WARPS
    if pieces and splits > 1:
        raise ValueError("pieces contract whole rows: they take no splits")
    name = name or "decode_matvec_residual"
    interpret = _interpret(interpret)
    params = _params(num_warps, num_stages)
    if splits == 1:
        block_n, block_k = _matvec_blocks(n, k, 1, block_n, block_k)
        kernel = functools.partial(
            _matvec_residual_kernel,
            rows=rows,
            n=n,
            k=k,
            block_n=block_n,
            block_k=block_k,
            pieces=pieces,
        )
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(residual.shape, residual.dtype),
            grid=(_cdiv(n, block_n),),
            interpret=interpret,
            name=name,
            compiler_params=params,
        )(x, w, residual)
    if block_k is None:
        block_k = min(_pow2(_cdiv(k, splits)), _MAX_BLOCK_K)
    block_n, block_k = _matvec_blocks(n, k, 1, block_n, block_k)
    chunks = _cdiv(_cdiv(k, block_k), splits)
    splits = _cdiv(_cdiv(k, block_k), chunks)  # no split left without a chunk
    partial_kernel = functools.partial(
        _matvec_partial_kernel,
        rows=rows,
        n=n,
        k=k,
        block_n=block_n,
        block_k=block_k,
        chunks=chunks,
        splits=splits,
    )
    partials = pl.pallas_call(
        partial_kernel,
        out_shape=jax.ShapeDtypeStruct((splits, rows, n), jnp.float32),
        grid=(_cdiv(n, block_n), splits),
        interpret=interpret,
        name=name,
        compiler_params=params,
    )(x, w)
    sum_block = min(_pow2(n), max(16, _TILE // (_pow2(splits) * rows)))
    sum_kernel = functools.partial(
        _split_sum_kernel, rows=rows, n=n, splits=splits, block_n=sum_block
    )
    return pl.pallas_call(
        sum_kernel,
        out_shape=jax.ShapeDtypeStruct(residual.shape, residual.dtype),
        grid=(_cdiv(n, sum_block),),
        interpret=interpret,
        name=f"{name}_combine",
        compiler_params=params,
    )(partials, residual)


# --------------------------------------------------------------------------------------------
# RMSNorm alone (the final norm, before the output head)
# --------------------------------------------------------------------------------------------


def _rms_norm_kernel(
    x_ref: Ref, s_ref: Ref, o_ref: Ref, *, k: int, eps: float, block_k: int
) -> None:
    row = pl.program_id(0)
    k_ok = (jnp.arange(block_k) < k) if block_k != k else None
    x = _load(x_ref.at[row, pl.ds(0, block_k)], k_ok).astype(jnp.float32)
    scale = _load(s_ref.at[pl.ds(0, block_k)], k_ok)
    normed = (x * jax.lax.rsqrt(jnp.sum(x * x) / k + eps)).astype(o_ref.dtype)
    y = scale.astype(o_ref.dtype) * normed
    plgpu.store(o_ref.at[row, pl.ds(0, block_k)], y, mask=k_ok)


def rms_norm(
    x: jax.Array,
    scale: jax.Array,
    *,
    eps: float,
    interpret: bool | None = None,
    num_warps: int = _NUM_WARPS,
    name: str | None = None,
) -> jax.Array:
    """`qwen2.rms_norm` of x [R, hidden] as one kernel (XLA makes a reduction and a multiply).

    A program a row, the whole row in one tile: the rounding is `qwen2.rms_norm`'s.
    """
    rows, k = x.shape
    kernel = functools.partial(_rms_norm_kernel, k=k, eps=eps, block_k=_pow2(k))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows,),
        interpret=_interpret(interpret),
        name=name or "decode_rms_norm",
        compiler_params=_params(num_warps, 1),
    )(x, scale)


# --------------------------------------------------------------------------------------------
# RMSNorm + gate/up projection + silu(gate) * up
# --------------------------------------------------------------------------------------------


def _gate_up_kernel(
    x_ref: Ref,
    w_ref: Ref,
    o_ref: Ref,
    *,
    rows: int,
    inner: int,
    k: int,
    eps: float,
    block_n: int,
    block_k: int,
    pieces: bool,
) -> None:
    f32 = jnp.float32
    n0 = pl.multiple_of(pl.program_id(0) * block_n, block_n)
    n_ok = (n0 + jnp.arange(block_n) < inner) if inner % block_n else None
    accs, ssqs = _dot_rows(
        x_ref,
        w_ref,
        [n0, n0 + inner],  # gate rows, then the up rows of the same outputs
        n_ok,
        rows=rows,
        k=k,
        block_n=block_n,
        block_k=block_k,
        with_norm=True,
        pieces=pieces,
    )
    assert ssqs is not None
    dtype = o_ref.dtype
    for r in range(rows):
        inv = jax.lax.rsqrt(ssqs[r] / k + eps)
        gate = (accs[r][0] * inv).astype(dtype).astype(f32)
        up = (accs[r][1] * inv).astype(dtype).astype(f32)
        act = (gate * jax.nn.sigmoid(gate)).astype(dtype).astype(f32)
        plgpu.store(o_ref.at[np.int32(r), pl.ds(n0, block_n)], (act * up).astype(dtype), mask=n_ok)


def gate_up_silu(
    x: jax.Array,
    w: jax.Array,
    *,
    eps: float,
    block_n: int | None = None,
    block_k: int | None = None,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int = 1,
    pieces: bool = False,
    name: str | None = None,
) -> jax.Array:
    """silu(g) * u for [g, u] = (x @ w[c].T) / rms(x); x [R, hidden], w [2, inner, hidden].

    `w` carries the RMSNorm scale (diag(scale) W). Returns [R, inner] in x's dtype.
    `num_warps=None` picks by the tile's size (`_warps`).
    `pieces=True` contracts each row in one pass of exact power-of-two spans (`_pieces`)
    instead of `block_k`-wide chunks, so a row like 4,864 holds no masked registers.
    """
    rows, k = x.shape
    inner = w.shape[1]
    if block_n is None:
        block_n = min(_GATE_UP_BLOCK_N, _pow2(inner))
    block_n, block_k = _matvec_blocks(inner, k, 2, block_n, block_k)
    if num_warps is None:
        num_warps = _warps("gate_up", 2 * block_n * block_k, rows)
    kernel = functools.partial(
        _gate_up_kernel,
        rows=rows,
        inner=inner,
        k=k,
        eps=eps,
        block_n=block_n,
        block_k=block_k,
        pieces=pieces,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, inner), x.dtype),
        grid=(_cdiv(inner, block_n),),
        interpret=_interpret(interpret),
        name=name or "decode_gate_up_silu",
        compiler_params=_params(num_warps, num_stages),
    )(x, w.reshape(2 * inner, k))


# --------------------------------------------------------------------------------------------
# RMSNorm + QKV projection + bias + RoPE
# --------------------------------------------------------------------------------------------


def _qkv_rope_kernel(
    x_ref: Ref,
    w_ref: Ref,
    b_ref: Ref,
    pos_ref: Ref,
    freq_ref: Ref,
    o_ref: Ref,
    *,
    rows: int,
    slots: int,
    head_dim: int,
    k: int,
    eps: float,
    block_j: int,
    block_k: int,
    pieces: bool,
) -> None:
    f32 = jnp.float32
    half = head_dim // 2
    head = pl.program_id(0)  # over kv_heads * slots, each slot a query, key or value head
    j0 = pl.multiple_of(pl.program_id(1) * block_j, block_j)
    j_ok = (j0 + jnp.arange(block_j) < half) if half % block_j else None
    first = head * head_dim + j0  # rows of the first half of this head's dimensions
    second = first + half  # and of their rotation partners
    # The epilogue's operands first: their round trips overlap the weights'. The angles are
    # made here from each row's position (no load waits on another's).
    bias_a = _load(b_ref.at[pl.ds(first, block_j)], j_ok)
    bias_b = _load(b_ref.at[pl.ds(second, block_j)], j_ok)
    inv_freq = _load(freq_ref.at[pl.ds(j0, block_j)], j_ok)
    angles = [pos_ref[np.int32(r)].astype(f32) * inv_freq for r in range(rows)]
    accs, ssqs = _dot_rows(
        x_ref,
        w_ref,
        [first, second],
        j_ok,
        rows=rows,
        k=k,
        block_n=block_j,
        block_k=block_k,
        with_norm=True,
        pieces=pieces,
    )
    assert ssqs is not None
    dtype = o_ref.dtype
    rotate = head % slots != slots - 1  # the last slot of each KV group is the value head
    for r, angle in enumerate(angles):
        sin, cos = jnp.sin(angle), jnp.cos(angle)
        inv = jax.lax.rsqrt(ssqs[r] / k + eps)
        a = (accs[r][0] * inv).astype(dtype) + bias_a
        b = (accs[r][1] * inv).astype(dtype) + bias_b
        a32, b32 = a.astype(f32), b.astype(f32)
        a = jnp.where(rotate, (a32 * cos - b32 * sin).astype(dtype), a)
        b = jnp.where(rotate, (b32 * cos + a32 * sin).astype(dtype), b)
        plgpu.store(o_ref.at[np.int32(r), pl.ds(first, block_j)], a, mask=j_ok)
        plgpu.store(o_ref.at[np.int32(r), pl.ds(second, block_j)], b, mask=j_ok)


def qkv_rope(
    x: jax.Array,
    w: jax.Array,
    bias: jax.Array,
    positions: jax.Array,
    inv_freq: jax.Array,
    *,
    eps: float,
    block_j: int | None = None,
    block_k: int | None = None,
    interpret: bool | None = None,
    num_warps: int | None = None,
    num_stages: int = 1,
    pieces: bool = False,
    name: str | None = None,
) -> jax.Array:
    """Queries, keys and values of R tokens, rotated: [R, kv_heads, group + 2, head_dim].

    x [R, hidden] is the residual (not normalised); w [kv_heads, group + 2, head_dim, hidden]
    and bias [kv_heads, group + 2, head_dim] are `DecodeLayerWeights.qkv` / `.qkv_bias` (per KV
    head: its query heads, its key, its value; the RMSNorm scale folded into w); positions
    [R] and inv_freq [head_dim // 2] (`qwen2.rope_frequencies`) give the angles, which the
    kernel makes itself as `qwen2.rope_angles` does (the same float32 products, sine and
    cosine): a table read there would wait on the position's load, a round trip the
    weights' loads would queue behind. Each program owns `block_j` dimension pairs
    (d, d + half) of one head, so the rotation happens in registers; value heads are not
    rotated. `num_warps=None` picks by the tile's size (`_warps`). `pieces=True` contracts
    each row in one pass of exact power-of-two spans (`_pieces`) instead of `block_k`-wide
    chunks, so a row like 4,864 holds no masked registers.
    """
    rows, k = x.shape
    kv, slots, head_dim, _ = w.shape
    if head_dim % 2:
        raise ValueError("RoPE needs an even head_dim")
    half = head_dim // 2
    heads = kv * slots
    if block_j is None:
        block_j, block_k = _matvec_blocks(
            heads * half, k, 2, None, block_k, min_programs=_QKV_MIN_PROGRAMS
        )
        block_j = min(block_j, _pow2(half))
    else:
        block_j, block_k = _matvec_blocks(heads * half, k, 2, block_j, block_k)
    if num_warps is None:
        num_warps = _warps("qkv", 2 * block_j * block_k, rows)
    kernel = functools.partial(
        _qkv_rope_kernel,
        rows=rows,
        slots=slots,
        head_dim=head_dim,
        k=k,
        eps=eps,
        block_j=block_j,
        block_k=block_k,
        pieces=pieces,
    )
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, heads * head_dim), x.dtype),
        grid=(heads, _cdiv(half, block_j)),
        interpret=_interpret(interpret),
        name=name or "decode_qkv_rope",
        compiler_params=_params(num_warps, num_stages),
    )(
        x,
        w.reshape(heads * head_dim, k),
        bias.reshape(heads * head_dim).astype(x.dtype),
        jnp.asarray(positions, jnp.int32).reshape(rows),
        jnp.asarray(inv_freq, jnp.float32).reshape(half),
    )
    return out.reshape(rows, kv, slots, head_dim)


# --------------------------------------------------------------------------------------------
# Attention of one new token over the KV cache (and the cache write)
# --------------------------------------------------------------------------------------------


def _attention_kernel(
    qkv_ref: Ref,
    bounds_ref: Ref,
    index_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    k_out_ref: Ref,
    v_out_ref: Ref,
    *out_refs: Ref,
    group: int,
    head_dim: int,
    length: int,
    block_g: int,
    block_d: int,
    block_s: int,
    chunks: int,
    splits: int,
    from_starts: bool,
) -> None:
    f32 = jnp.float32
    row, head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    dtype = qkv_ref.dtype
    g_ok = (jnp.arange(block_g) < group) if block_g != group else None
    d_ok = (jnp.arange(block_d) < head_dim) if block_d != head_dim else None
    gd_ok = _tile_mask(g_ok, d_ok)
    q = _load(qkv_ref.at[row, head, pl.ds(0, block_g), pl.ds(0, block_d)], gd_ok)
    k_new = _load(qkv_ref.at[row, head, np.int32(group), pl.ds(0, block_d)], d_ok).astype(
        k_ref.dtype
    )
    v_new = _load(qkv_ref.at[row, head, np.int32(group + 1), pl.ds(0, block_d)], d_ok).astype(
        v_ref.dtype
    )
    index = index_ref[np.int32(0)]
    start = bounds_ref[row] if from_starts else None  # the row's first attended slot

    @pl.when(split == 0)
    def _write_cache() -> None:
        plgpu.store(k_out_ref.at[row, head, index, pl.ds(0, block_d)], k_new, mask=d_ok)
        plgpu.store(v_out_ref.at[row, head, index, pl.ds(0, block_d)], v_new, mask=d_ok)

    # Other programs may read slot `index` before or after the write: use the new key and value
    # from registers there, as if read back from the updated cache.
    k_new, v_new = k_new.astype(dtype), v_new.astype(dtype)
    scale = head_dim**-0.5
    tail = splits * chunks * block_s != length

    def step(c: jax.Array, carry: tuple) -> tuple:
        top, total, acc = carry
        s0 = pl.multiple_of((split * chunks + c) * block_s, block_s)
        slots = s0 + jnp.arange(block_s)
        s_ok = (slots < length) if tail else None
        sd_ok = _tile_mask(s_ok, d_ok)
        fresh = (slots == index)[:, None]
        keys = _load(k_ref.at[row, head, pl.ds(s0, block_s), pl.ds(0, block_d)], sd_ok)
        keys = jnp.where(fresh, k_new[None, :], keys.astype(dtype))
        values = _load(v_ref.at[row, head, pl.ds(s0, block_s), pl.ds(0, block_d)], sd_ok)
        values = jnp.where(fresh, v_new[None, :], values.astype(dtype))
        if from_starts:
            allowed = (slots >= start) & (slots <= index)
        else:
            allowed = _load(bounds_ref.at[row, pl.ds(s0, block_s)], s_ok) != 0
        scores = jax.lax.dot_general(
            q,
            keys,
            (((1,), (1,)), ((), ())),
            precision=jax.lax.Precision.HIGHEST,
            preferred_element_type=f32,
        )
        scores = jnp.where(allowed[None, :], scores * scale, _NEG_INF)
        new_top = jnp.maximum(top, jnp.max(scores, axis=1))
        p = jnp.exp(scores - new_top[:, None])
        if s_ok is not None:  # past the cache: no weight at all (masked slots keep qwen2's)
            p = jnp.where(s_ok[None, :], p, 0.0)
        alpha = jnp.exp(top - new_top)
        pv = jax.lax.dot_general(
            p.astype(dtype),
            values,
            (((1,), (0,)), ((), ())),
            precision=jax.lax.Precision.HIGHEST,
            preferred_element_type=f32,
        )
        return new_top, alpha * total + jnp.sum(p, axis=1), alpha[:, None] * acc + pv

    top0 = jnp.full((block_g,), _NEG_INF, f32)
    total0 = jnp.zeros((block_g,), f32)
    acc0 = jnp.zeros((block_g, block_d), f32)
    # A program that loops stops at the new token's chunk: later slots are the future (masked
    # anyway), so its loop, and the cache it reads, grow with the sequence. One chunk stays
    # straight-line code: its loads need not wait for `index` to arrive first.
    count: jax.Array | int = chunks
    if chunks > 1:
        count = jnp.clip((index + block_s) // block_s - split * chunks, 0, chunks)
    top, total, acc = jax.lax.fori_loop(0, count, step, (top0, total0, acc0))
    if splits == 1:
        (out_ref,) = out_refs
        out = (acc / total[:, None]).astype(out_ref.dtype)
        plgpu.store(out_ref.at[row, head, pl.ds(0, block_g), pl.ds(0, block_d)], out, mask=gd_ok)
    else:
        top_ref, total_ref, acc_ref = out_refs
        plgpu.store(top_ref.at[row, head, split, :], top)
        plgpu.store(total_ref.at[row, head, split, :], total)
        plgpu.store(acc_ref.at[row, head, split, :, :], acc)


def _combine_kernel(
    top_ref: Ref,
    total_ref: Ref,
    acc_ref: Ref,
    out_ref: Ref,
    *,
    head_dim: int,
    splits: int,
    block_d: int,
) -> None:
    """Merge the splits' softmax partials (max, sum, unnormalised output) of one query head.

    All splits are read in one [splits, head_dim] tile: a loop over them would chain one
    global-memory round trip per split, and the kernel is pure latency.
    """
    row, head, g = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    block_p = _pow2(splits)
    p_ok = (jnp.arange(block_p) < splits) if block_p != splits else None
    d_ok = (jnp.arange(block_d) < head_dim) if block_d != head_dim else None
    tops = _load(top_ref.at[row, head, pl.ds(0, block_p), g], p_ok, _NEG_INF)  # [P]
    totals = _load(total_ref.at[row, head, pl.ds(0, block_p), g], p_ok)
    pd_ok = _tile_mask(p_ok, d_ok)
    accs = _load(acc_ref.at[row, head, pl.ds(0, block_p), g, pl.ds(0, block_d)], pd_ok)
    top = jnp.max(tops)
    weights = jnp.exp(tops - top)  # masked splits: exp(-inf-ish) = 0
    total = jnp.sum(weights * totals)
    out = jnp.sum(weights[:, None] * accs, axis=0) / total
    plgpu.store(out_ref.at[row, head, g, pl.ds(0, block_d)], out.astype(out_ref.dtype), mask=d_ok)


def attention(
    qkv: jax.Array,
    mask: jax.Array | None,
    cache_k: jax.Array,
    cache_v: jax.Array,
    index: jax.Array | int,
    *,
    starts: jax.Array | None = None,
    block_s: int | None = None,
    splits: int | None = None,
    interpret: bool | None = None,
    num_warps: int = _NUM_WARPS,
    num_stages: int = 1,
    name: str | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One new token per row attends over its cache; its key and value are written at `index`.

    qkv [R, kv_heads, group + 2, head_dim] from `qkv_rope`; mask [R, length] (nonzero = attend),
    or None with `starts` [R], each row's first attended slot, when the mask is the slots from
    it to `index` (a decode loop's): the kernel then needs no mask array made every step;
    cache_k, cache_v [R, kv_heads, length, head_dim], updated in place (aliased). Returns the
    attention output [R, heads * head_dim] (heads in q_proj order) and the two caches.

    Same semantics as `qwen2.cached_attention` with T = 1 under a causal mask: scores in
    float32 scaled by 1 / sqrt(head_dim), masked slots at a finite minimum, probabilities in
    the compute dtype against the values. The mask must exclude the slots after `index` (the
    future): a program that loops over several `block_s`-long chunks never reads those wholly
    in the future, so its work grows with the sequence. A program owns one
    (row, KV head, split of the cache length): all `group` query heads share each key and value
    tile, read once. With more than one split, a second small kernel merges the splits'
    online-softmax partials; `splits=None` picks enough splits for ~96 programs.
    """
    rows, kv, slots, head_dim = qkv.shape
    group = slots - 2
    length = cache_k.shape[2]
    if (mask is None) == (starts is None):
        raise ValueError("attention takes a mask or the rows' starts, exactly one of them")
    bounds = (
        jnp.asarray(starts, jnp.int32).reshape(rows)
        if mask is None
        else jnp.asarray(mask).reshape(rows, length).astype(jnp.int32)
    )
    wanted = _cdiv(_ATTENTION_PROGRAMS, rows * kv)
    if block_s is None:
        block_s = min(_MAX_BLOCK_S, max(16, _pow2(length)))
        while block_s > _MIN_BLOCK_S and _cdiv(length, block_s) < wanted:
            block_s //= 2
    if block_s < 16 or block_s & (block_s - 1):
        raise ValueError(f"block_s={block_s} must be a power of two >= 16")
    n_chunks = _cdiv(length, block_s)
    if splits is None:
        splits = max(1, min(n_chunks, wanted))
    chunks = _cdiv(n_chunks, max(1, min(splits, n_chunks)))
    splits = _cdiv(n_chunks, chunks)
    block_g = max(16, _pow2(group))  # the dot products need 16 rows, 16 columns
    block_d = max(16, _pow2(head_dim))
    interpret = _interpret(interpret)
    index = jnp.asarray(index, jnp.int32).reshape(1)
    dims = {"group": group, "head_dim": head_dim, "block_g": block_g, "block_d": block_d}
    out_shape = jax.ShapeDtypeStruct((rows, kv, group, head_dim), qkv.dtype)
    if splits == 1:
        partial_shapes = [out_shape]
    else:
        partial_shapes = [
            jax.ShapeDtypeStruct((rows, kv, splits, block_g), jnp.float32),
            jax.ShapeDtypeStruct((rows, kv, splits, block_g), jnp.float32),
            jax.ShapeDtypeStruct((rows, kv, splits, block_g, block_d), jnp.float32),
        ]
    kernel = functools.partial(
        _attention_kernel,
        length=length,
        block_s=block_s,
        chunks=chunks,
        splits=splits,
        from_starts=mask is None,
        **dims,
    )
    new_k, new_v, *partials = pl.pallas_call(
        kernel,
        out_shape=[
            jax.ShapeDtypeStruct(cache_k.shape, cache_k.dtype),
            jax.ShapeDtypeStruct(cache_v.shape, cache_v.dtype),
            *partial_shapes,
        ],
        grid=(rows, kv, splits),
        input_output_aliases={3: 0, 4: 1},
        interpret=interpret,
        name=name or "decode_attention",
        compiler_params=_params(num_warps, num_stages),
    )(qkv, bounds, index, cache_k, cache_v)
    if splits == 1:
        (out,) = partials
    else:
        out = pl.pallas_call(
            functools.partial(_combine_kernel, head_dim=head_dim, splits=splits, block_d=block_d),
            out_shape=out_shape,
            grid=(rows, kv, group),
            interpret=interpret,
            name=f"{name or 'decode_attention'}_combine",
            compiler_params=_params(num_warps, num_stages),
        )(*partials)
    return out.reshape(rows, kv * group * head_dim), new_k, new_v
