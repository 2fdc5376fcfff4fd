"""What every RL objective shares: the batch, its masks, and reductions that ignore masked entries.

A batch is B prompts x G samples x T completion tokens. Entries that do not count (padding
tokens, samples the sandbox could not judge, truncated completions) may hold any value, NaN
included: every function here selects them away with `jnp.where` before any arithmetic, so
they reach neither a value nor a gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k3")


class RLBatch(NamedTuple):
    """One step's rollouts, everything but the current policy's log-probs (the differentiated input).

    old_logp:     [B,G,T] per-token log-probs under the behaviour policy (the sampler's).
    mask:         [B,G,T] completion tokens that count.
    valid:        [B,G] usable sample; False for sandbox failures and truncated completions.
    correct:      [B,G] verified correct.
    speed_reward: [B,G] r_s from `rewards.speed_reward`, read only where correct.
    ref_logp:     [B,G,T] reference policy's log-probs, or None (only GRPO's KL reads it).
    """

    old_logp: jax.Array
    mask: jax.Array
    valid: jax.Array
    correct: jax.Array
    speed_reward: jax.Array
    ref_logp: jax.Array | None = None


def check_batch(batch: RLBatch, logp: jax.Array) -> None:
    """Raise ValueError unless every array has the [B,G,T] or [B,G] shape of `logp`."""
    if logp.ndim != 3:
        raise ValueError(f"logp must be [B, G, T], got shape {tuple(logp.shape)}")
    for name in ("old_logp", "mask", "ref_logp"):
        value = getattr(batch, name)
        if value is not None and value.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(value.shape)}, logp {tuple(logp.shape)}")
    for name in ("valid", "correct", "speed_reward"):
        value = getattr(batch, name)
        if value.shape != logp.shape[:2]:
            raise ValueError(
                f"{name} has shape {tuple(value.shape)}, expected [B, G] = {logp.shape[:2]}"
            )


def usable_samples(batch: RLBatch) -> jax.Array:
    """[B,G]: valid and with at least one counted token (an empty completion has no score)."""
    return batch.valid.astype(bool) & batch.mask.astype(bool).any(axis=-1)


def counted_tokens(batch: RLBatch) -> jax.Array:
    """[B,G,T]: the tokens that enter the loss, i.e. `mask` restricted to usable samples."""
    return batch.mask.astype(bool) & usable_samples(batch)[..., None]


def select(x: jax.Array | None, where: jax.Array) -> jax.Array | None:
    """`x` as float32 where `where` holds, 0 elsewhere (the gradient there is exactly 0)."""
    return None if x is None else jnp.where(where, x.astype(jnp.float32), 0.0)


def masked_mean(x: jax.Array, where: jax.Array, axis: int | None = None) -> jax.Array:
    """Mean of `x` over the entries where `where` holds; 0 when there are none."""
    total = jnp.sum(jnp.where(where, x, 0.0), axis=axis)
    return total / jnp.maximum(jnp.sum(where, axis=axis), 1)


def sequence_scores(logp: jax.Array, tokens: jax.Array) -> jax.Array:
    """[B,G] s(o): mean token log-prob of each completion over its counted tokens."""
    return masked_mean(logp, tokens, axis=-1)


def masked_logsumexp(x: jax.Array, where: jax.Array, axis: int = -1) -> jax.Array:
    """log Σ_{where} exp(x) along `axis`, stable, 0 where nothing is selected, no NaN gradients."""
    peak = jnp.max(jnp.where(where, x, -jnp.inf), axis=axis, keepdims=True)
    # The result does not depend on `peak`, so cutting its gradient is exact.
    peak = jax.lax.stop_gradient(jnp.where(jnp.isfinite(peak), peak, 0.0))
    shifted = jnp.exp(jnp.where(where, x, peak) - peak)
    total = jnp.sum(jnp.where(where, shifted, 0.0), axis=axis, keepdims=True)
    out = peak + jnp.log(jnp.where(total > 0, total, 1.0))
    return jnp.squeeze(out, axis=axis)


def masked_log_softmax(x: jax.Array, where: jax.Array, axis: int = -1) -> jax.Array:
    """log softmax of `x` over the entries where `where` holds; -inf elsewhere."""
    x = jnp.where(where, x, 0.0)
    lse = jnp.expand_dims(masked_logsumexp(x, where, axis=axis), axis)
    return jnp.where(where, x - lse, -jnp.inf)


def kl_per_token(logp_p: jax.Array, logp_q: jax.Array, estimator: str) -> jax.Array:
    """Per-token estimate of KL(p‖q) from tokens drawn from p (Schulman's k1 or k3).

    With d = log q − log p: k1 = −d (unbiased, either sign); k3 = (e^d − 1) − d (unbiased,
    never negative, lower variance when p and q are close).
    """
    log_ratio = logp_q - logp_p
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return jnp.expm1(log_ratio) - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def split_outcomes(usable: jax.Array, correct: jax.Array) -> tuple[jax.Array, jax.Array]:
    """([B,G] S+, [B,G] S−): the usable samples that are correct, and the usable rest."""
    correct = correct.astype(bool)
    return usable & correct, usable & ~correct


def group_counts(positive: jax.Array, negative: jax.Array) -> dict[str, jax.Array]:
    """How many prompts are mixed, all correct, all wrong, or without a usable sample."""
    has_pos, has_neg = positive.any(axis=-1), negative.any(axis=-1)

    def count(x: jax.Array) -> jax.Array:
        return jnp.sum(x).astype(jnp.float32)

    return {
        "n_mixed": count(has_pos & has_neg),
        "n_all_correct": count(has_pos & ~has_neg),
        "n_all_wrong": count(~has_pos & has_neg),
        "n_no_usable": count(~has_pos & ~has_neg),
        "n_unusable_samples": count(~(positive | negative)),
    }
