"""A greedy decode step's bookkeeping as two Pallas kernels instead of about a dozen XLA ones.

Between two forward passes a greedy decode picks each row's token (the logits' argmax), its
log-probability, records both, advances lengths, stop windows, finish reasons and the step,
and looks up the next embedding rows. XLA:GPU makes a small kernel of nearly each of those
(two for the vocabulary-wide reduction), about 1.2 us apiece: at batch 1 they were 3% of a
0.5B step. Here

1. `logit_partials` reduces [B, V] logits in `block_v`-wide blocks, each to its max, the
   first index of that max and the sum of exp(x - max) (`sampler.logit_stats`' summary);
2. `greedy_update` merges those partials and does the rest of the step in one program.

`sampler` uses them for greedy decodes on the Pallas decode path (`decode.uses_pallas`); the
XLA bookkeeping stays the reference they are tested against. Logits are assumed finite or
-inf (a NaN logit's row is garbage on either path).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from learner.generate.decode_kernels import _cdiv, _interpret, _load, _params, _pow2, _tile_mask

Ref = jax.Array  # a Pallas reference to a kernel operand (Triton: a pointer)

# Logits a partial-reduction program reads: 75 programs over Qwen2's 151,936-wide vocabulary.
BLOCK_V = 2048
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
