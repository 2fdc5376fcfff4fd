"""A greedy decode step's bookkeeping as two Pallas kernels instead of about a dozen XLA ones.

Between two forward passes a greedy decode picks each row's token (the logits' argmax), its
log-probability, records both, advances lengths, stop windows, finish reasons and the step,
and looks up the next embedding rows. XLA:GPU makes a small kernel of nearly each of those
(two for the vocabulary-wide reduction), about 1.2 us apiece: at batch 1 they were 3% of a
0.5B step. Here

1. `logit_partials` reduces [B, V] logits in `block_v`-wide blocks, each to its max, the
   first index of that max and the sum of exp(x - max) (`sampler.logit_stats`' summary);
   `head_partials` does the same from the last layer's rows, with the final RMSNorm and
   the output head in the same kernel, so a step's logits are never written;
2. `greedy_update` merges those partials and does the rest of the step in one program.

`sampler` uses them for greedy decodes on the Pallas decode path (`qwen2.uses_pallas`):
`logit_partials` once on the prompt's logits, then `greedy_update` and `head_partials`
each step, around the layers' kernels. The XLA bookkeeping stays the reference they are
tested against. Logits are assumed finite or -inf (a NaN logit's row is garbage on either
path).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from learner.decode_kernels import (
    _cdiv,
    _interpret,
    _load,
    _params,
    _pieces,
    _pow2,
    _tile_mask,
)

Ref = jax.Array  # a Pallas reference to a kernel operand (Triton: a pointer)

# Logits a partial-reduction program reads: 75 programs over Qwen2's 151,936-wide vocabulary.
BLOCK_V = 2048
# `head_partials`' settings: vocabulary rows a program covers, weight elements it loads a
# loop step (rows of the hidden width, padded to a power of two: 16 at Qwen2-0.5B's 896)
# and its warps.
HEAD_BLOCK_V = 128
HEAD_TILE = 32768
HEAD_WARPS = 8
_FINISH_EOS, _FINISH_STOP = 1, 2  # `sampler` finish codes


class GreedyState(NamedTuple):
    """What a greedy decode carries from step to step, in the kernels' dtypes."""

    step: jax.Array  # [1] int32: tokens decoded so far
    tokens: jax.Array  # [B, steps] int32, pad where not decoded
    logprobs: jax.Array  # [B, steps] float32
    lengths: jax.Array  # [B] int32: tokens before each row finished
    done: jax.Array  # [B] int32, nonzero once a row finished
    reason: jax.Array  # [B] int32 finish code
    window: jax.Array  # [B, L] int32: the last L tokens, for the stop sequences


class NextInputs(NamedTuple):
    """The next forward pass's inputs, made by `greedy_update`."""

    rows: jax.Array  # [B, hidden]: the embedding rows of the tokens just picked
    positions: jax.Array  # [B] int32: their RoPE positions
    index: jax.Array  # [1] int32: the cache slot they are written to


def _scalar_store(ref: Ref, index: tuple, value: jax.Array) -> None:
    """Store one value at ref[index] (the last index a one-wide span: Triton stores blocks)."""
    *lead, last = index
    plgpu.store(ref.at[(*lead, pl.ds(last, 1))], jnp.broadcast_to(value, (1,)))


# --------------------------------------------------------------------------------------------
# 1. Partial (max, argmax, sum of exp) of each block of logits
# --------------------------------------------------------------------------------------------


def _logit_partials_kernel(
    logits_ref: Ref, top_ref: Ref, at_ref: Ref, total_ref: Ref, *, vocab: int, block_v: int
) -> None:
    row, part = pl.program_id(0), pl.program_id(1)
    cols = part * block_v + jnp.arange(block_v)
    ok = (cols < vocab) if vocab % block_v else None
    x = _load(logits_ref.at[row, pl.ds(part * block_v, block_v)], ok, -jnp.inf)
    x = x.astype(jnp.float32)
    top = jnp.max(x)
    at = jnp.min(jnp.where(x == top, cols, vocab))
    # At the max exp(0) = 1 exactly, also when the max is -inf (where x - top is NaN).
    weights = jnp.where(x == top, 1.0, jnp.exp(x - top))
    if ok is not None:
        weights = jnp.where(ok, weights, 0.0)
    _scalar_store(top_ref, (row, part), top)
    _scalar_store(at_ref, (row, part), at.astype(jnp.int32))
    _scalar_store(total_ref, (row, part), jnp.sum(weights))


def logit_partials(
    logits: jax.Array,
    *,
    block_v: int = BLOCK_V,
    interpret: bool | None = None,
    num_warps: int = 4,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per block of `block_v` logits of each row: max, first index of it, sum of exp(x - max).

    logits [B, V] -> three [B, cdiv(V, block_v)] arrays (float32, int32, float32) that
    `greedy_update` merges into each row's argmax and logsumexp.
    """
    rows, vocab = logits.shape
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v={block_v} must be a power of two >= 16")
    parts = _cdiv(vocab, block_v)
    shape = (rows, parts)
    return pl.pallas_call(
        functools.partial(_logit_partials_kernel, vocab=vocab, block_v=block_v),
        out_shape=[
            jax.ShapeDtypeStruct(shape, jnp.float32),
            jax.ShapeDtypeStruct(shape, jnp.int32),
            jax.ShapeDtypeStruct(shape, jnp.float32),
        ],
        grid=(rows, parts),
        interpret=_interpret(interpret),
        name="greedy_logit_partials",
        compiler_params=_params(num_warps, 1),
    )(logits)


# --------------------------------------------------------------------------------------------
# 1'. The final norm, the output head and those partials in one kernel (no logits written)
# --------------------------------------------------------------------------------------------


def _head_partials_kernel(
    x_ref: Ref, s_ref: Ref, w_ref: Ref, top_ref: Ref, at_ref: Ref, total_ref: Ref, *,
    rows: int, vocab: int, k: int, eps: float, block_v: int, block_n: int, pieces: bool,
) -> None:  # fmt: skip
    f32, i32 = jnp.float32, jnp.int32
    part = pl.program_id(0)
    # The hidden dimension as (traced offset, width, mask) spans: one padded to a power of
    # two, or exact power-of-two pieces (896 = 512 + 256 + 128: no masked registers).
    spans = []
    for start, size in _pieces(k) if pieces else [(0, _pow2(k))]:
        ok = (start + jnp.arange(size) < k) if start + size > k else None
        # A traced offset: the interpreter refuses a static slice that overhangs.
        spans.append((pl.multiple_of(i32(start) + part * 0, size), size, ok))
    dtype = x_ref.dtype
    scales = [_load(s_ref.at[pl.ds(at, size)], ok).astype(dtype) for at, size, ok in spans]
    xs = []
    for r in map(np.int32, range(rows)):  # `decode_kernels.rms_norm`'s rounding, then f32
        row = [_load(x_ref.at[r, pl.ds(at, size)], ok).astype(f32) for at, size, ok in spans]
        inv = jax.lax.rsqrt(sum(jnp.sum(x * x) for x in row) / k + eps)
        xs.append(
            [(c * (x * inv).astype(dtype)).astype(f32) for c, x in zip(scales, row, strict=True)]
        )
    ragged = vocab % block_v != 0

    def step(i: jax.Array, carry: tuple) -> tuple:
        # Per lane j of a chunk of `block_n` logits: the running max of the logits that
        # lane saw, the first index of it and the sum of exp(logit - that max).
        v0 = part * block_v + i * block_n
        cols = v0 + jnp.arange(block_n)
        v_ok = (cols < vocab) if ragged else None
        tiles = [
            _load(w_ref.at[pl.ds(v0, block_n), pl.ds(at, size)], _tile_mask(v_ok, ok))
            for at, size, ok in spans
        ]
        out = []
        for x, (top, at, total) in zip(xs, carry, strict=True):
            logit = sum(
                jnp.sum(t.astype(f32) * xp[None, :], axis=1) for t, xp in zip(tiles, x, strict=True)
            )
            if v_ok is not None:  # past the vocabulary: -inf, and neither counted nor first
                logit = jnp.where(v_ok, logit, -jnp.inf)
            new_top = jnp.maximum(top, logit)
            # exp(0) = 1 where a lane's max stays or is this logit (also at -inf).
            kept = jnp.where(top == new_top, total, total * jnp.exp(top - new_top))
            added = jnp.where(logit == new_top, 1.0, jnp.exp(logit - new_top))
            first = (logit > top) | (at == vocab)
            if v_ok is not None:
                added, first = jnp.where(v_ok, added, 0.0), first & v_ok
            out.append((new_top, jnp.where(first, cols, at), kept + added))
        return tuple(out)

    lanes = (
        jnp.full((block_n,), -jnp.inf, f32),
        jnp.full((block_n,), vocab, i32),
        jnp.zeros((block_n,), f32),
    )
    carry = jax.lax.fori_loop(0, block_v // block_n, step, tuple(lanes for _ in range(rows)))
    for r, (tops, ats, totals) in zip(map(np.int32, range(rows)), carry, strict=True):
        top = jnp.max(tops)
        _scalar_store(top_ref, (r, part), top)
        _scalar_store(at_ref, (r, part), jnp.min(jnp.where(tops == top, ats, vocab)))
        total = jnp.where(tops == top, totals, totals * jnp.exp(tops - top))
        _scalar_store(total_ref, (r, part), jnp.sum(total))


def head_partials(
    rows: jax.Array,
    norm_scale: jax.Array,
    head: jax.Array,
    *,
    eps: float,
    block_v: int = HEAD_BLOCK_V,
    block_n: int | None = None,
    interpret: bool | None = None,
    num_warps: int = HEAD_WARPS,
    num_stages: int = 1,
    pieces: bool = True,
    name: str | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`logit_partials` of the logits rms_norm(rows) @ head.T, which are never written.

    rows [B, hidden] (the last layer's output, before the final norm), norm_scale [hidden],
    head [V, hidden] (the embedding when tied). A program covers `block_v` vocabulary rows
    in chunks of `block_n` (default: as many as fill `HEAD_TILE`); the
    final norm, the matvec and the reduction are one kernel instead of three (two at batch
    one were XLA's head and the norm), and the logits go no further than registers.
    `pieces`: hidden rows in exact power-of-two spans (`decode_kernels._pieces`), as by
    default, or padded to one power of two.
    """
    batch, k = rows.shape
    vocab = head.shape[0]
    if head.shape[1] != k or norm_scale.shape != (k,):
        raise ValueError(
            f"head {head.shape} and scale {norm_scale.shape} do not match rows {rows.shape}"
        )
    if block_n is None:
        block_n = max(1, min(block_v, HEAD_TILE // _pow2(k)))
    for label, size in (("block_v", block_v), ("block_n", block_n)):
        if size < 1 or size & (size - 1):
            raise ValueError(f"{label}={size} must be a power of two")
    if block_n > block_v:
        raise ValueError(f"block_n={block_n} must not exceed block_v={block_v}")
    parts = _cdiv(vocab, block_v)
    shape = (batch, parts)
    kernel = functools.partial(
        _head_partials_kernel, rows=batch, vocab=vocab, k=k, eps=eps, block_v=block_v,
        block_n=block_n, pieces=pieces,
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        out_shape=[
            jax.ShapeDtypeStruct(shape, jnp.float32),
            jax.ShapeDtypeStruct(shape, jnp.int32),
            jax.ShapeDtypeStruct(shape, jnp.float32),
        ],
        grid=(parts,),
        interpret=_interpret(interpret),
        name=name or "greedy_head_partials",
        compiler_params=_params(num_warps, num_stages),
    )(rows, norm_scale, head)


# --------------------------------------------------------------------------------------------
# 2. The rest of the step, one program
# --------------------------------------------------------------------------------------------


def _merge_partials(
    top_ref: Ref, at_ref: Ref, total_ref: Ref, row: np.int32, *, parts: int, vocab: int
) -> tuple[jax.Array, jax.Array]:
    """A row's argmax and log-probability of it, from its blocks' partials."""
    block_p = _pow2(parts)
    p_ok = (jnp.arange(block_p) < parts) if block_p != parts else None
    tops = _load(top_ref.at[row, pl.ds(0, block_p)], p_ok, -jnp.inf)
    ats = _load(at_ref.at[row, pl.ds(0, block_p)], p_ok, vocab)
    totals = _load(total_ref.at[row, pl.ds(0, block_p)], p_ok)
    top = jnp.max(tops)
    best = jnp.min(jnp.where(tops == top, ats, vocab))
    # A block at the max keeps its sum (exp(0) = 1; -inf - -inf would be NaN).
    total = jnp.sum(jnp.where(tops == top, totals, totals * jnp.exp(tops - top)))
    return best, top - (top + jnp.log(total))


def _greedy_update_kernel(*refs: Ref, rows: int, parts: int, vocab: int, width: int,
                          max_new: int, pad_id: int, n_eos: int, n_stops: int,
                          stop_len: int, hidden: int) -> None:  # fmt: skip
    top_ref, at_ref, total_ref, prompt_ref, emb_ref, *refs = refs
    eos_ref = refs.pop(0) if n_eos else None
    stops_ref = refs.pop(0) if n_stops else None
    step_ref, tokens_ref, logprobs_ref, lengths_ref, done_ref, reason_ref, window_ref = refs[:7]
    (step_out, tokens_out, logprobs_out, lengths_out, done_out, reason_out, window_out,
     rows_out, positions_out, index_out) = refs[7:]  # fmt: skip
    del tokens_ref, logprobs_ref  # written in place at this step's column only
    i32 = jnp.int32
    step = step_ref[np.int32(0)]
    block_l = _pow2(stop_len)
    lanes = jnp.arange(block_l)
    l_ok = (lanes < stop_len) if block_l != stop_len else None
    # The window shifted by one: a traced offset (the interpreter refuses a static slice
    # that overhangs its row, masked or not).
    shift = pl.multiple_of(i32(1) + pl.program_id(0) * 0, 1)
    block_m = _pow2(hidden)
    m_ok = (jnp.arange(block_m) < hidden) if block_m != hidden else None
    for r in map(np.int32, range(rows)):
        best, logprob = _merge_partials(top_ref, at_ref, total_ref, r, parts=parts, vocab=vocab)
        done = done_ref[r] != 0
        token = jnp.where(done, i32(pad_id), best).astype(i32)
        _scalar_store(tokens_out, (r, step), token)
        _scalar_store(logprobs_out, (r, step), jnp.where(done, 0.0, logprob))
        _scalar_store(lengths_out, (r,), lengths_ref[r] + jnp.where(done, i32(0), i32(1)))
        older = _load(window_ref.at[r, pl.ds(shift, block_l)], lanes < stop_len - 1, -2)
        window = jnp.where(lanes == stop_len - 1, token, older)
        plgpu.store(window_out.at[r, pl.ds(0, block_l)], window, mask=l_ok)
        # Finish code and flag built only from the checks there are: a select on a literal
        # bool lowers to a Triton select of mismatched types, which the GPU rejects.
        code, finished = i32(0), done | (step + 1 >= max_new)
        if n_eos:
            block_e = _pow2(n_eos)
            e_ok = (jnp.arange(block_e) < n_eos) if block_e != n_eos else None
            eos = _load(eos_ref.at[pl.ds(0, block_e)], e_ok, -1)
            hit_eos = jnp.max(jnp.where(eos == token, i32(1), i32(0))) > 0
            code, finished = jnp.where(hit_eos, i32(_FINISH_EOS), code), finished | hit_eos
        if n_stops:
            block_n = _pow2(n_stops)
            n_ok = (jnp.arange(block_n) < n_stops) if block_n != n_stops else None
            # Off the table: -1, which matches anything and is no real token.
            stops = _load(
                stops_ref.at[r, pl.ds(0, block_n), pl.ds(0, block_l)], _tile_mask(n_ok, l_ok), -1
            )
            one, zero = i32(1), i32(0)
            equal = jnp.where((stops == window[None, :]) | (stops < 0), one, zero)
            real = jnp.max(jnp.where(stops >= 0, one, zero), axis=1) > 0
            hit_stop = jnp.max(jnp.where((jnp.min(equal, axis=1) > 0) & real, one, zero)) > 0
            code, finished = jnp.where(hit_stop, i32(_FINISH_STOP), code), finished | hit_stop
        _scalar_store(reason_out, (r,), jnp.where(done, reason_ref[r], code))
        _scalar_store(done_out, (r,), jnp.where(finished, i32(1), i32(0)))
        _scalar_store(positions_out, (r,), prompt_ref[r] + step)
        row = _load(emb_ref.at[token, pl.ds(0, block_m)], m_ok)
        plgpu.store(rows_out.at[r, pl.ds(0, block_m)], row, mask=m_ok)
    _scalar_store(step_out, (np.int32(0),), step + 1)
    _scalar_store(index_out, (np.int32(0),), width + step)


def greedy_update(
    partials: tuple[jax.Array, jax.Array, jax.Array],
    state: GreedyState,
    prompt_lens: jax.Array,
    embedding: jax.Array,
    eos_ids: jax.Array,
    stops: jax.Array,
    *,
    vocab: int,
    width: int,
    max_new: int,
    pad_id: int,
    interpret: bool | None = None,
    num_warps: int = 4,
) -> tuple[GreedyState, NextInputs]:
    """One greedy step's bookkeeping, as `sampler`'s XLA loop body does it, in one program.

    From `logit_partials`' output: each row's token (pad once the row is done) and its
    log-probability (0 once done) go into column `step` of the state's buffers (in place);
    lengths, the stop window, finish reasons (eos 1, stop sequence 2) and done flags advance
    as in `sampler._decode`; then the next pass's inputs: the tokens' embedding rows, their
    positions (prompt_lens + step) and cache slot (width + step). The state is updated in
    place (its buffers are aliased), so a decode loop carries it without copies.
    """
    top, at, total = partials
    rows, parts = top.shape
    hidden = embedding.shape[1]
    n_eos, (_, n_stops, stop_len) = eos_ids.shape[0], stops.shape
    if state.window.shape != (rows, stop_len):
        raise ValueError(f"window {state.window.shape} does not match stops {stops.shape}")
    inputs = [top, at, total, prompt_lens.astype(jnp.int32), embedding]
    inputs += [eos_ids.astype(jnp.int32)] if n_eos else []
    inputs += [stops.astype(jnp.int32)] if n_stops else []
    first = len(inputs)
    kernel = functools.partial(
        _greedy_update_kernel,
        rows=rows,
        parts=parts,
        vocab=vocab,
        width=width,
        max_new=max_new,
        pad_id=pad_id,
        n_eos=n_eos,
        n_stops=n_stops,
        stop_len=stop_len,
        hidden=hidden,
    )
    i32 = jnp.int32
    out = pl.pallas_call(
        kernel,
        out_shape=[
            *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in state),
            jax.ShapeDtypeStruct((rows, hidden), embedding.dtype),
            jax.ShapeDtypeStruct((rows,), i32),
            jax.ShapeDtypeStruct((1,), i32),
        ],
        grid=(1,),
        input_output_aliases={first + i: i for i in range(len(state))},
        interpret=_interpret(interpret),
        name="greedy_update",
        compiler_params=_params(num_warps, 1),
    )(*inputs, *state)
    return GreedyState(*out[: len(state)]), NextInputs(*out[len(state) :])
