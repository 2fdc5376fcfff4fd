"""Per-token log-probabilities: what scoring, SFT and the RL objectives are built from."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from learner.model import qwen2


def gather_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits)[target] along the last axis, in float32, without the full softmax."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def next_token_logprobs(
    model: qwen2.Qwen2,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    mask: jax.Array | None = None,
    *,
    chunk: int = 0,
    segment_ids: jax.Array | None = None,
) -> jax.Array:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for every t: [batch, time - 1].

    With `chunk` > 0 the output projection runs `chunk` positions at a time and is recomputed
    in the backward pass, so the [batch, time, vocab] logits never exist at once (151k-entry
    vocabularies make them the largest activation of a small model).

    `segment_ids` [batch, time] (0 = padding) scores packed rows: each token sees only its own
    segment, and positions default to restarting per segment. Entry t across a segment
    boundary (the last token of one sequence "predicting" the first of the next) and entries
    on padding mean nothing: mask them in the loss.
    """
    batch, length = tokens.shape
    if positions is None:
        if segment_ids is None:
            positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        else:
            positions = qwen2.segment_positions(segment_ids)
    hidden, _ = model.hidden_states(tokens, positions, mask, segment_ids=segment_ids)
    hidden, targets = hidden[:, :-1], tokens[:, 1:]
    steps = length - 1
    if chunk <= 0 or steps <= chunk:
        return gather_logprobs(model.logits(hidden), targets)
    pad = -steps % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    n = hidden.shape[1] // chunk
    hidden = hidden.reshape(batch, n, chunk, -1).swapaxes(0, 1)
    targets = targets.reshape(batch, n, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        h, t = args
        return gather_logprobs(model.logits(h), t)

    out = jax.lax.map(one, (hidden, targets))  # [n, batch, chunk]
    return out.swapaxes(0, 1).reshape(batch, n * chunk)[:, :steps]
