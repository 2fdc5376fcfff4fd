"""GRPO against a plain float64 NumPy reading of the formulas, on hand-made groups."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.rl.algorithms import get_algorithm
from learner.rl.common import RLBatch
from learner.rl.drpo import DRPOConfig
from learner.rl.grpo import GRPOConfig, group_advantages, grpo_loss

B, G, T = 4, 4, 5
CORRECT = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]], bool)
VALID = np.array([[1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1], [1, 1, 0, 0]], bool)
LENGTHS = np.array([[5, 3, 1, 4], [2, 5, 4, 3], [5, 2, 2, 1], [4, 2, 5, 3]])
SPEEDUPS = np.array([[2.0, 0.5, 1, 1], [1.3, 0.9, 4.0, 1.0], [1, 1, 1, 1], [0.7, 1, 1.5, 1]])


def make_batch(seed: int = 0) -> tuple[RLBatch, np.ndarray]:
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.05, 3.0, (B, G, T))
    batch = RLBatch(
        old_logp=jnp.asarray(logp + 0.3 * rng.standard_normal((B, G, T)), jnp.float32),
        ref_logp=jnp.asarray(logp + 0.2 * rng.standard_normal((B, G, T)), jnp.float32),
        mask=jnp.asarray(np.arange(T) < LENGTHS[..., None]),
        valid=jnp.asarray(VALID),
        correct=jnp.asarray(CORRECT),
        speed_reward=jnp.asarray(np.log(SPEEDUPS), jnp.float32),
    )
    return batch, logp.astype(np.float32)


def reference(batch: RLBatch, logp: np.ndarray, cfg: GRPOConfig) -> tuple[float, np.ndarray]:
    """Loss and d loss / d logp, group by group and sample by sample, in float64."""
    logp = logp.astype(np.float64)
    old, ref = np.asarray(batch.old_logp, np.float64), np.asarray(batch.ref_logp, np.float64)
    mask, r_s = np.asarray(batch.mask), np.asarray(batch.speed_reward, np.float64)
    loss, grad = 0.0, np.zeros_like(logp)
    for b in range(B):
        used = [g for g in range(G) if VALID[b, g] and mask[b, g].any()]
        rewards = np.array([(1 + cfg.speed_weight * r_s[b, g]) * CORRECT[b, g] for g in used])
        adv = (rewards - rewards.mean()) / (rewards.std() + cfg.adv_eps)
        for g, a in zip(used, adv, strict=True):
            m = mask[b, g]
            ratio = np.exp(logp[b, g][m] - old[b, g][m])
            clipped = np.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps)
            d_ref = ref[b, g][m] - logp[b, g][m]
            per_token = -np.minimum(ratio * a, clipped * a) + cfg.kl_coef * (
                np.exp(d_ref) - d_ref - 1
            )
            loss += per_token.mean() / len(used) / B
            d_policy = np.where(clipped * a < ratio * a, 0.0, -ratio * a)
            d_kl = cfg.kl_coef * (1 - np.exp(d_ref))
            grad[b, g][m] = (d_policy + d_kl) / m.sum() / len(used) / B
    return loss, grad


def loss_and_grad(batch: RLBatch, logp, cfg: GRPOConfig):
    (loss, metrics), grad = jax.value_and_grad(grpo_loss, argnums=1, has_aux=True)(
        batch, jnp.asarray(logp), cfg
    )
    return loss, metrics, np.asarray(grad)


@pytest.mark.parametrize("kl_coef", [0.0, 0.04])
def test_matches_numpy_reference(kl_coef: float) -> None:
    batch, logp = make_batch()
    cfg = GRPOConfig(kl_coef=kl_coef)
    loss, metrics, grad = loss_and_grad(batch, logp, cfg)
    want_loss, want_grad = reference(batch, logp, cfg)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    assert 0 < metrics["clip_fraction"] < 1  # the batch exercises both sides of the clip
    assert metrics["n_all_correct"] == 1 and metrics["n_all_wrong"] == 1
    # The all-correct group still has speed differences, so it contributes; all-wrong does not.
    assert metrics["n_contributing"] == 3 and metrics["n_unusable_samples"] == 3


def test_group_normalisation_ignores_invalid_samples() -> None:
    rewards = np.array([[1.0, 0.0, 1.4, 1e6], [0.5, 0.5, -7.0, 0.5]], np.float32)
    usable = np.array([[True, True, True, False], [True, True, False, True]])
    adv = np.asarray(group_advantages(jnp.asarray(rewards), jnp.asarray(usable), 1e-4))
    r = rewards[0, :3].astype(np.float64)
    np.testing.assert_allclose(adv[0, :3], (r - r.mean()) / (r.std() + 1e-4), rtol=1e-5)
    assert np.all(adv[~usable] == 0) and np.all(adv[1] == 0)  # equal usable rewards: no signal
    garbage = np.where(usable, rewards, np.nan)
    np.testing.assert_array_equal(group_advantages(jnp.asarray(garbage), usable, 1e-4), adv)


def test_gradient_is_zero_where_the_ratio_is_clipped() -> None:
    """One group, a correct and a wrong sample (A = +1, −1), ratios either side of [0.8, 1.2]."""
    ratios = np.array([[[1.5, 1.1, 0.5]], [[0.5, 1.5, 0.9]]]).reshape(1, 2, 3)
    # A > 0: 1.5 is clipped, 1.1 inside, 0.5 unclipped (min takes the lower ρ·A);
    # A < 0: 0.5 is clipped, 1.5 unclipped, 0.9 inside.
    clipped = np.array([[[True, False, False], [True, False, False]]])
    logp = np.full((1, 2, 3), -1.0, np.float32)
    batch = RLBatch(
        old_logp=jnp.asarray(logp - np.log(ratios), jnp.float32),
        mask=jnp.ones((1, 2, 3), bool),
        valid=jnp.ones((1, 2), bool),
        correct=jnp.asarray([[True, False]]),
        speed_reward=jnp.zeros((1, 2)),
    )
    _, metrics, grad = loss_and_grad(batch, logp, GRPOConfig(kl_coef=0.0))
    assert np.all(grad[clipped] == 0) and np.all(grad[~clipped] != 0)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 6, rtol=1e-6)


def test_gradients_finite_and_masked_or_invalid_entries_change_nothing() -> None:
    batch, logp = make_batch()
    rng = np.random.default_rng(3)
    ignored = ~(np.asarray(batch.mask) & VALID[..., None])
    garbage = np.where(rng.random((B, G, T)) < 0.5, np.nan, 1e30 * rng.standard_normal((B, G, T)))
    noisy = batch._replace(
        old_logp=jnp.where(ignored, garbage, batch.old_logp),
        ref_logp=jnp.where(ignored, -garbage, batch.ref_logp),
        correct=jnp.where(VALID, batch.correct, ~CORRECT),
        speed_reward=jnp.where(VALID & CORRECT, batch.speed_reward, jnp.nan),
    )
    noisy_logp = np.where(ignored, garbage, logp).astype(np.float32)
    cfg = GRPOConfig()
    loss, metrics, grad = loss_and_grad(batch, logp, cfg)
    loss2, metrics2, grad2 = loss_and_grad(noisy, noisy_logp, cfg)
    assert np.all(np.isfinite(grad)) and np.all(grad[ignored] == 0)
    assert loss == loss2
    np.testing.assert_array_equal(grad, grad2)
    for key, value in metrics.items():
        np.testing.assert_array_equal(value, metrics2[key], err_msg=key)


def test_reference_policy_is_optional_only_without_kl() -> None:
    batch, logp = make_batch()
    batch = batch._replace(ref_logp=None)
    loss, metrics = get_algorithm("grpo").loss_fn(batch, jnp.asarray(logp), GRPOConfig(kl_coef=0))
    assert np.isfinite(loss) and metrics["kl_ref"] == 0
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(batch, jnp.asarray(logp), GRPOConfig())
    with pytest.raises(TypeError, match="GRPOConfig"):
        grpo_loss(batch, jnp.asarray(logp), DRPOConfig())


def test_jit_matches_eager() -> None:
    batch, logp = make_batch()
    cfg = GRPOConfig()
    eager, _ = grpo_loss(batch, jnp.asarray(logp), cfg)
    jitted, _ = jax.jit(grpo_loss, static_argnums=2)(batch, logp, cfg)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)


@pytest.mark.parametrize(
    "bad", [{"clip_eps": 0.0}, {"clip_eps": 1.0}, {"kl_coef": -0.1}, {"adv_eps": 0.0},
            {"speed_weight": float("inf")}]
)  # fmt: skip
def test_config_validation(bad: dict) -> None:
    with pytest.raises(ValueError, match="GRPOConfig"):
        GRPOConfig(**bad)
