"""GRPO, the baseline: group-normalised advantages, clipped importance ratio, k3 KL to a reference.

Per prompt q with G samples, over its usable samples only:

    R(o)   = correct · (1 + w·r_s)                                (rewards.scalar_reward)
    A(o)   = (R − mean_q R) / (std_q R + ε_A)                     (population std)
    ρ_t    = exp(log π − log π_old) for token t
    ℓ_t    = −min(ρ_t·A, clip(ρ_t, 1 − ε, 1 + ε)·A) + c·k3_t(π‖π_ref)
    loss   = mean over prompts of (mean over usable samples of (mean over tokens of ℓ_t))

Choices where the design is silent: the token losses are averaged per sequence, then per
group, then over all B prompts (as DRPO), so every usable sample of a group weighs the same
whatever its length and every prompt weighs the same whatever its number of usable
samples. The population std keeps a group with one usable sample defined (its A is 0).
Unusable samples (invalid, or no counted token) enter neither the group statistics nor the
loss. c = 0 switches the KL off and lets `ref_logp` be None. The metrics' `kl` is k3 of
KL(π_old‖π), as DRPO reports it, so the two runs' curves compare; `kl_ref` is the penalised one.

Gradient accumulation: every term is local to its prompt group and the divisor B is the
batch's prompt count, so the loss is a sum over prompts. A micro-batch of whole groups
contributes `grpo_micro_loss` = (1/B)·Σ_{q∈m} ℓ_q; `grpo_coupling` carries only B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.rl.common import (
    RLBatch,
    check_batch,
    counted_tokens,
    group_counts,
    kl_per_token,
    masked_mean,
    select,
    split_outcomes,
    usable_samples,
)
from learner.rl.rewards import scalar_reward


@dataclass(frozen=True)
class GRPOConfig:
    """ε (clip_eps), c (kl_coef), w (speed_weight of the scalar reward), ε_A (adv_eps)."""

    clip_eps: float = 0.2
    kl_coef: float = 0.04
    speed_weight: float = 0.2
    adv_eps: float = 1e-4

    def __post_init__(self) -> None:
        for name in ("clip_eps", "kl_coef", "speed_weight", "adv_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"GRPOConfig.{name} must be non-negative, got {value!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"GRPOConfig.clip_eps must lie in (0, 1), got {self.clip_eps!r}")
        if self.adv_eps <= 0:
            raise ValueError(f"GRPOConfig.adv_eps must be positive, got {self.adv_eps!r}")


def group_advantages(rewards: jax.Array, usable: jax.Array, eps: float) -> jax.Array:
    """[B,G] A = (R − mean R) / (std R + eps) over each group's usable samples; 0 elsewhere."""
    mean = masked_mean(rewards, usable, axis=-1)[:, None]
    centred = jnp.where(usable, rewards - mean, 0.0)
    std = jnp.sqrt(masked_mean(jnp.square(centred), usable, axis=-1))[:, None]
    return jax.lax.stop_gradient(centred / (std + eps))


def clipped_surrogate(
    log_ratio: jax.Array, advantage: jax.Array, clip_eps: float
) -> tuple[jax.Array, jax.Array]:
    """(min(ρ·A, clip(ρ)·A), where the clipped term is the smaller): PPO's pessimistic bound.

    Where the clipped term wins, it is constant in ρ, so that token has no gradient.
    """
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantage
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantage
    return jnp.minimum(unclipped, clipped), clipped < unclipped


class GRPOCoupling(NamedTuple):
    """What couples GRPO's micro-batches: only the batch's prompt count B (additive)."""

    n_prompts: jax.Array


class _Parts(NamedTuple):
    """The per-prompt losses and the pieces the metrics read."""

    policy: jax.Array  # [B] per-prompt clipped-surrogate loss
    kl: jax.Array  # [B] per-prompt mean k3 KL to the reference
    kl_ref: jax.Array  # [B,G,T]
    kl_old: jax.Array  # [B,G,T] k3 of KL(π_old‖π)
    clipped: jax.Array  # [B,G,T]
    tokens: jax.Array
    usable: jax.Array
    rewards: jax.Array
    advantages: jax.Array
    positive: jax.Array
    negative: jax.Array


def _parts(batch: RLBatch, logp: jax.Array, config: GRPOConfig, caller: str) -> _Parts:
    if not isinstance(config, GRPOConfig):
        raise TypeError(f"{caller} needs a GRPOConfig, got {type(config).__name__}")
    check_batch(batch, logp)
    if config.kl_coef > 0 and batch.ref_logp is None:
        raise ValueError("GRPO with kl_coef > 0 needs batch.ref_logp (or set kl_coef=0)")
    usable = usable_samples(batch)
    tokens = counted_tokens(batch)
    logp, old_logp = select(logp, tokens), select(batch.old_logp, tokens)
    positive, negative = split_outcomes(usable, batch.correct)

    rewards = scalar_reward(positive, batch.speed_reward, config.speed_weight)
    advantages = group_advantages(rewards, usable, config.adv_eps)
    surrogate, clipped = clipped_surrogate(logp - old_logp, advantages[..., None], config.clip_eps)
    kl_ref = jnp.zeros_like(logp)
    if config.kl_coef > 0:
        kl_ref = kl_per_token(logp, select(batch.ref_logp, tokens), "k3")

    def per_prompt(per_token: jax.Array) -> jax.Array:
        per_sample = masked_mean(per_token, tokens, axis=-1)
        return masked_mean(per_sample, usable, axis=-1)

    return _Parts(
        policy=per_prompt(-surrogate),
        kl=per_prompt(kl_ref),
        kl_ref=kl_ref,
        kl_old=kl_per_token(old_logp, logp, "k3"),
        clipped=clipped,
        tokens=tokens,
        usable=usable,
        rewards=rewards,
        advantages=advantages,
        positive=positive,
        negative=negative,
    )


def grpo_loss(
    batch: RLBatch, logp: jax.Array, config: GRPOConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of one batch; differentiate with respect to `logp` [B,G,T]."""
    parts = _parts(batch, logp, config, "grpo_loss")
    tokens = parts.tokens
    policy_loss = jnp.mean(parts.policy)
    loss = policy_loss + config.kl_coef * jnp.mean(parts.kl)
    metrics = {
        "loss": loss,
        "policy_loss": policy_loss,
        "kl": masked_mean(parts.kl_old, tokens),
        "kl_ref": masked_mean(parts.kl_ref, tokens),
        "clip_fraction": masked_mean(parts.clipped.astype(jnp.float32), tokens),
        "reward_mean": masked_mean(parts.rewards, parts.usable),
        "n_contributing": jnp.sum(jnp.any(parts.advantages != 0, axis=-1)).astype(jnp.float32),
        **group_counts(parts.positive, parts.negative),
    }
    return loss, jax.lax.stop_gradient(metrics)


def grpo_coupling(batch: RLBatch, logp: jax.Array | None, config: GRPOConfig) -> GRPOCoupling:
    """The batch's prompt count; `logp` is not read (None is fine), so no extra pass."""
    del logp, config
    return GRPOCoupling(n_prompts=jnp.asarray(batch.valid.shape[0], jnp.float32))


def grpo_micro_loss(
    batch: RLBatch, logp: jax.Array, config: GRPOConfig, coupling: GRPOCoupling
) -> jax.Array:
    """(1/B)·Σ_{q∈m} ℓ_q for a micro-batch of whole prompt groups: the micro-batches' values
    and gradients sum to `grpo_loss`'s."""
    parts = _parts(batch, logp, config, "grpo_micro_loss")
    return jnp.sum(parts.policy + config.kl_coef * parts.kl) / coupling.n_prompts
