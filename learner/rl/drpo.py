"""DRPO: decoupled-reward policy optimisation (DisCO's discriminative objective, speed-weighted).

Per prompt q with G samples, S+ the usable verified-correct samples and S− the usable rest:

    s(o)  = mean token log-prob of o under the current policy            (sequence score)
    ω(o)  = softmax over S+ of r_s(o)/λ, no gradient                     (speed weight)
    J_q   = Σ_{S+} ω·s − τ·log Σ_{S−} exp(s/τ)       (0 when S+ or S− is empty)
    loss  = −mean_q J_q + (β/2)·max(KL(π_old‖π) − δ, 0)²

Choices where the design is silent:
- The mean over prompts is over all B prompts, contributing or not, as in DisCO's reference
  code: a prompt's weight in the step does not grow when the other prompts of the batch are
  uninformative, and the divisor is a constant of the batch shape.
- The negative term is τ·logsumexp exactly as written; DisCO's code uses a log-mean-exp,
  which differs by the constant τ·log|S−| and so has the same gradient.
- KL(π_old‖π) is the mean over all counted tokens of the batch of a per-token estimate from
  tokens drawn from π_old: "k3" (default, as DisCO: (r − 1) − log r with r = π/π_old, never
  negative, low variance) or "k1" (log π_old − log π). Both are unbiased. Samples from a
  sampler one update behind need no importance ratio: s(o) is not a surrogate of a return,
  and the KL term measures the distance to the very policy that drew them.
- Samples that are not usable (invalid, or no counted token) belong to neither S+ nor S−
  and their tokens do not enter the KL: they change nothing.

Gradient accumulation: the loss is not a sum over micro-batches (the penalty squares the
batch KL), but its gradient is. With S the batch's KL sum and N its counted tokens,
∇loss = c·∇S − (1/B)·Σ_q ∇J_q where c = β·max(S/N − δ, 0)/N. So `drpo_coupling` takes
(S, N, B) from the whole batch in a pass without gradient, and `drpo_micro_loss` of a
micro-batch m of whole prompt groups, c·S_m − (1/B)·Σ_{q∈m} J_q with c held constant,
has gradients that sum over the micro-batches to the full batch's exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from learner.rl.common import (
    KL_ESTIMATORS,
    RLBatch,
    check_batch,
    counted_tokens,
    group_counts,
    kl_per_token,
    masked_log_softmax,
    masked_logsumexp,
    masked_mean,
    select,
    sequence_scores,
    split_outcomes,
    usable_samples,
)


@dataclass(frozen=True)
class DRPOConfig:
    """β (penalty strength), τ (negative-term temperature), λ (speed-weight temperature),
    δ (KL budget); defaults are the paper's."""

    beta: float = 100.0
    tau: float = 5.0
    lam: float = 0.1
    delta: float = 0.001
    kl_estimator: str = "k3"

    def __post_init__(self) -> None:
        for name, low, strict in (("beta", 0, False), ("tau", 0, True), ("lam", 0, True)):
            value = getattr(self, name)
            if not (math.isfinite(value) and (value > low if strict else value >= low)):
                bound = "positive" if strict else "non-negative"
                raise ValueError(f"DRPOConfig.{name} must be {bound} and finite, got {value!r}")
        if not (math.isfinite(self.delta) and self.delta >= 0):
            raise ValueError(f"DRPOConfig.delta must be non-negative, got {self.delta!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"DRPOConfig.kl_estimator: choose one of {KL_ESTIMATORS}")


def speed_weights(speed_reward: jax.Array, positive: jax.Array, lam: float) -> jax.Array:
    """[B,G] ω: softmax over each prompt's S+ of r_s/λ, 0 outside S+, without gradient.

    Computed in log space: with λ = 0.1 and r_s = log speedup, ω ∝ speedup^10, which would
    overflow float32 as a plain ratio for speedups past ~7000.
    """
    logits = jnp.where(positive, speed_reward.astype(jnp.float32), 0.0) / lam
    return jax.lax.stop_gradient(jnp.exp(masked_log_softmax(logits, positive)))


def prompt_objectives(
    scores: jax.Array, omega: jax.Array, positive: jax.Array, negative: jax.Array, tau: float
) -> jax.Array:
    """[B] J_q = Σ_{S+} ω·s − τ·logsumexp_{S−}(s/τ), and 0 where S+ or S− is empty."""
    pulled_up = jnp.sum(omega * scores, axis=-1)
    pushed_down = tau * masked_logsumexp(scores / tau, negative)
    contributing = positive.any(axis=-1) & negative.any(axis=-1)
    return jnp.where(contributing, pulled_up - pushed_down, 0.0)


def kl_penalty(kl: jax.Array, beta: float, delta: float) -> jax.Array:
    """(β/2)·max(KL − δ, 0)²: free inside the budget δ, quadratic past it."""
    return 0.5 * beta * jnp.square(jnp.maximum(kl - delta, 0.0))


class DRPOCoupling(NamedTuple):
    """What couples DRPO's micro-batches, each a sum over the batch (so sums of parts add up):
    the KL estimates of the counted tokens, their number, and the number of prompts B."""

    kl_sum: jax.Array
    n_tokens: jax.Array
    n_prompts: jax.Array


class _Parts(NamedTuple):
    """The per-prompt and per-token pieces both the loss and its micro-batch form read."""

    objectives: jax.Array  # [B] J_q
    kl_tokens: jax.Array  # [B,G,T] per-token KL estimate, 0 where not counted
    tokens: jax.Array  # [B,G,T] counted tokens
    scores: jax.Array
    omega: jax.Array
    positive: jax.Array
    negative: jax.Array


def _parts(batch: RLBatch, logp: jax.Array, config: DRPOConfig, caller: str) -> _Parts:
    if not isinstance(config, DRPOConfig):
        raise TypeError(f"{caller} needs a DRPOConfig, got {type(config).__name__}")
    check_batch(batch, logp)
    usable = usable_samples(batch)
    tokens = counted_tokens(batch)
    logp, old_logp = select(logp, tokens), select(batch.old_logp, tokens)
    positive, negative = split_outcomes(usable, batch.correct)
    scores = sequence_scores(logp, tokens)
    omega = speed_weights(batch.speed_reward, positive, config.lam)
    objectives = prompt_objectives(scores, omega, positive, negative, config.tau)
    kl_tokens = jnp.where(tokens, kl_per_token(old_logp, logp, config.kl_estimator), 0.0)
    return _Parts(objectives, kl_tokens, tokens, scores, omega, positive, negative)


def drpo_loss(
    batch: RLBatch, logp: jax.Array, config: DRPOConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(loss, metrics) of one batch; differentiate with respect to `logp` [B,G,T]."""
    parts = _parts(batch, logp, config, "drpo_loss")
    objective = jnp.mean(parts.objectives)
    kl = masked_mean(parts.kl_tokens, parts.tokens)
    penalty = kl_penalty(kl, config.beta, config.delta)
    loss = penalty - objective

    metrics = {"loss": loss, "objective": objective, "kl": kl, "penalty": penalty}
    metrics |= _diagnostics(parts.scores, parts.omega, parts.positive, parts.negative)
    return loss, jax.lax.stop_gradient(metrics)


def drpo_coupling(batch: RLBatch, logp: jax.Array, config: DRPOConfig) -> DRPOCoupling:
    """The batch-wide sums a micro-batch's loss needs, without gradient. Additive: the
    coupling of a batch is the element-wise sum of its parts' couplings."""
    parts = _parts(batch, logp, config, "drpo_coupling")
    coupling = DRPOCoupling(
        kl_sum=jnp.sum(parts.kl_tokens),
        n_tokens=jnp.sum(parts.tokens).astype(jnp.float32),
        n_prompts=jnp.asarray(logp.shape[0], jnp.float32),
    )
    return jax.lax.stop_gradient(coupling)


def kl_slope(coupling: DRPOCoupling, config: DRPOConfig) -> jax.Array:
    """c = d penalty / d S = β·max(KL − δ, 0)/N, the weight of each token's KL estimate."""
    n_tokens = jnp.maximum(coupling.n_tokens, 1.0)
    kl = coupling.kl_sum / n_tokens
    return jax.lax.stop_gradient(config.beta * jnp.maximum(kl - config.delta, 0.0) / n_tokens)


def drpo_micro_loss(
    batch: RLBatch, logp: jax.Array, config: DRPOConfig, coupling: DRPOCoupling
) -> jax.Array:
    """c·S_m − (1/B)·Σ_{q∈m} J_q for a micro-batch of whole prompt groups, c and B from the
    whole batch's `coupling`: its gradient is this micro-batch's share of `drpo_loss`'s
    gradient (its value is not a share of the loss; read the loss from `drpo_loss`)."""
    parts = _parts(batch, logp, config, "drpo_micro_loss")
    penalty_part = kl_slope(coupling, config) * jnp.sum(parts.kl_tokens)
    return penalty_part - jnp.sum(parts.objectives) / coupling.n_prompts


def _diagnostics(
    scores: jax.Array, omega: jax.Array, positive: jax.Array, negative: jax.Array
) -> dict[str, jax.Array]:
    """Group counts, the sharpness of ω on contributing prompts, mean scores of S+ and S−."""
    counts = group_counts(positive, negative)
    contributing = positive.any(axis=-1) & negative.any(axis=-1)
    entropy = -jnp.sum(jnp.where(omega > 0, omega * jnp.log(omega), 0.0), axis=-1)
    return {
        "n_contributing": counts.pop("n_mixed"),
        **counts,
        "omega_max": masked_mean(jnp.max(omega, axis=-1), contributing),
        "omega_entropy": masked_mean(entropy, contributing),
        "score_pos": masked_mean(scores, positive),
        "score_neg": masked_mean(scores, negative),
    }
