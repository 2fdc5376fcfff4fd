"""DRPO against a plain float64 NumPy reading of the formulas, on hand-made groups."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner.rl.algorithms import ALGORITHMS, get_algorithm
from learner.rl.common import RLBatch
from learner.rl.drpo import DRPOConfig, drpo_loss, kl_penalty, speed_weights
from learner.rl.grpo import GRPOConfig

B, G, T = 5, 4, 6
# Prompt 0 mixed; 1 all correct; 2 all wrong; 3 mixed once two invalid samples are dropped;
# 4 all wrong once an invalid correct sample and a valid but empty correct one are dropped.
CORRECT = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], bool)
VALID = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 1]], bool)
LENGTHS = np.array([[6, 3, 1, 5], [2, 6, 4, 3], [5, 5, 2, 1], [4, 2, 6, 3], [3, 6, 2, 0]])
SPEEDUPS = np.array(
    [[2.0, 0.5, 1, 1], [1.3, 0.9, 4.0, 1.0], [1, 1, 1, 1], [0.7, 1, 1.5, 1], [3.0, 1, 1, 2.0]]
)


def make_batch(noise: float, seed: int = 0) -> tuple[RLBatch, np.ndarray]:
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.05, 3.0, (B, G, T))
    old_logp = logp + noise * (rng.standard_normal((B, G, T)) + 0.5)
    mask = np.arange(T) < LENGTHS[..., None]
    batch = RLBatch(
        old_logp=jnp.asarray(old_logp, jnp.float32),
        mask=jnp.asarray(mask),
        valid=jnp.asarray(VALID),
        correct=jnp.asarray(CORRECT),
        speed_reward=jnp.asarray(np.log(SPEEDUPS), jnp.float32),
    )
    return batch, logp.astype(np.float32)


def reference(batch: RLBatch, logp: np.ndarray, cfg: DRPOConfig) -> dict[str, np.ndarray]:
    """Loss, parts and d loss / d logp, sample by sample in float64."""
    logp = logp.astype(np.float64)
    old, mask = np.asarray(batch.old_logp, np.float64), np.asarray(batch.mask)
    r_s = np.asarray(batch.speed_reward, np.float64)
    n_prompts = logp.shape[0]
    d_objective = np.zeros_like(logp)
    objective, kl_sum, n_tokens = 0.0, 0.0, 0
    for b in range(n_prompts):
        used = [g for g in range(G) if VALID[b, g] and mask[b, g].any()]
        for g in used:
            d = logp[b, g][mask[b, g]] - old[b, g][mask[b, g]]
            kl_sum += np.sum(np.exp(d) - 1 - d if cfg.kl_estimator == "k3" else -d)
            n_tokens += d.size
        pos = [g for g in used if CORRECT[b, g]]
        neg = [g for g in used if not CORRECT[b, g]]
        if not pos or not neg:
            continue
        score = {g: logp[b, g][mask[b, g]].mean() for g in used}
        w = np.exp(r_s[b, pos] / cfg.lam - np.max(r_s[b, pos] / cfg.lam))
        w /= w.sum()
        s_neg = np.array([score[g] for g in neg])
        objective += np.dot(w, [score[g] for g in pos])
        objective -= cfg.tau * np.log(np.sum(np.exp(s_neg / cfg.tau)))
        softmax_neg = np.exp(s_neg / cfg.tau) / np.sum(np.exp(s_neg / cfg.tau))
        for g, weight in [*zip(pos, w, strict=True), *zip(neg, -softmax_neg, strict=True)]:
            d_objective[b, g][mask[b, g]] = weight / mask[b, g].sum() / n_prompts
    objective /= n_prompts
    kl = kl_sum / n_tokens
    penalty = cfg.beta / 2 * max(kl - cfg.delta, 0.0) ** 2
    tokens = mask & (VALID & mask.any(-1))[..., None]
    d_kl = np.where(tokens, np.exp(logp - old) - 1 if cfg.kl_estimator == "k3" else -1.0, 0)
    grad = cfg.beta * max(kl - cfg.delta, 0.0) * d_kl / n_tokens - d_objective
    return {"loss": penalty - objective, "objective": objective, "kl": kl, "penalty": penalty,
            "grad": grad}  # fmt: skip


def loss_and_grad(batch: RLBatch, logp, cfg: DRPOConfig):
    (loss, metrics), grad = jax.value_and_grad(drpo_loss, argnums=1, has_aux=True)(
        batch, jnp.asarray(logp), cfg
    )
    return loss, metrics, np.asarray(grad)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("noise", [0.001, 0.3])
def test_matches_numpy_reference(estimator: str, noise: float) -> None:
    batch, logp = make_batch(noise)
    cfg = DRPOConfig(kl_estimator=estimator)
    loss, metrics, grad = loss_and_grad(batch, logp, cfg)
    want = reference(batch, logp, cfg)
    for key in ("objective", "kl", "penalty"):
        np.testing.assert_allclose(metrics[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(loss, want["loss"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want["grad"], rtol=1e-5, atol=1e-6)
    assert (metrics["penalty"] > 0) == (noise > 0.1)  # both sides of the KL budget are covered
    counts = {k: float(metrics[k]) for k in ("n_contributing", "n_all_correct", "n_all_wrong")}
    assert counts == {"n_contributing": 2, "n_all_correct": 1, "n_all_wrong": 2}
    assert metrics["n_no_usable"] == 0 and metrics["n_unusable_samples"] == 4


def test_one_sided_groups_contribute_nothing() -> None:
    batch, logp = make_batch(noise=0.3)
    one_sided = np.array([1, 2, 4])
    sub = RLBatch(*(x[one_sided] if x is not None else None for x in batch))
    loss, metrics, grad = loss_and_grad(sub, logp[one_sided], DRPOConfig(beta=0.0))
    assert loss == 0 and metrics["objective"] == 0 and metrics["n_contributing"] == 0
    assert np.all(grad == 0)
    # Alongside mixed prompts they add nothing but their share of the mean over prompts.
    mixed = np.array([0, 3])
    sub = RLBatch(*(x[mixed] if x is not None else None for x in batch))
    _, alone, _ = loss_and_grad(sub, logp[mixed], DRPOConfig())
    _, full, _ = loss_and_grad(batch, logp, DRPOConfig())
    np.testing.assert_allclose(full["objective"] * B, alone["objective"] * 2, rtol=1e-6)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_speed_weights_finite_and_exact_from_1e_minus3_to_1e3(kind: str) -> None:
    speedups = np.logspace(-3, 3, 13)
    r_s = np.log(speedups) if kind == "log" else speedups  # power, alpha = 1: the widest
    positive = np.ones((2, 13), bool)
    positive[1, ::2] = False  # a second prompt whose S+ is every other sample
    omega = np.asarray(speed_weights(jnp.asarray([r_s, r_s], jnp.float32), positive, lam=0.1))
    assert np.all(np.isfinite(omega))
    for row in range(2):
        logits = r_s[positive[row]] / 0.1
        want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        np.testing.assert_allclose(omega[row][positive[row]], want, rtol=1e-5, atol=1e-7)
        assert np.all(omega[row][~positive[row]] == 0)
        np.testing.assert_allclose(omega[row].sum(), 1.0, rtol=1e-5)


def test_speed_weights_ignore_rewards_outside_s_plus_and_empty_groups() -> None:
    r_s = jnp.asarray([[np.nan, 0.0, np.inf], [np.nan, np.nan, np.nan]], jnp.float32)
    positive = np.array([[False, True, False], [False, False, False]])
    omega = np.asarray(speed_weights(r_s, positive, lam=0.1))
    np.testing.assert_array_equal(omega, [[0, 1, 0], [0, 0, 0]])


def test_kl_penalty_is_zero_inside_budget_and_quadratic_past_it() -> None:
    beta, delta = 100.0, 0.001
    kl = np.array([0.0, 0.0004, 0.001, 0.0015, 0.05, 1.0], np.float32)
    got = np.asarray(kl_penalty(jnp.asarray(kl), beta, delta))
    want = beta / 2 * np.maximum(kl.astype(np.float64) - delta, 0) ** 2
    assert np.all(got[:3] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("shift", [0.0005, 0.02])
def test_kl_term_through_the_loss(shift: float) -> None:
    """With k1 and old_logp = logp + c on every token the estimate is exactly c."""
    batch, logp = make_batch(noise=0.0)
    batch = batch._replace(old_logp=jnp.asarray(logp + shift))
    cfg = DRPOConfig(kl_estimator="k1")
    loss, metrics, grad = loss_and_grad(batch, logp, cfg)
    _, _, grad_without_kl = loss_and_grad(batch, logp, dataclasses.replace(cfg, beta=0.0))
    np.testing.assert_allclose(metrics["kl"], shift, rtol=1e-4)
    if shift <= cfg.delta:
        assert metrics["penalty"] == 0
        np.testing.assert_array_equal(grad, grad_without_kl)
    else:
        np.testing.assert_allclose(metrics["penalty"], 50 * (shift - 0.001) ** 2, rtol=1e-3)
        assert not np.allclose(grad, grad_without_kl)


def test_gradients_finite_and_zero_on_masked_tokens_and_invalid_samples() -> None:
    batch, logp = make_batch(noise=0.3)
    _, _, grad = loss_and_grad(batch, logp, DRPOConfig())
    counted = np.asarray(batch.mask) & VALID[..., None]
    assert np.all(np.isfinite(grad))
    assert np.all(grad[~counted] == 0)
    assert np.count_nonzero(grad[counted]) == counted.sum()


def test_masked_and_invalid_entries_change_nothing() -> None:
    batch, logp = make_batch(noise=0.3)
    rng = np.random.default_rng(7)
    ignored = ~(np.asarray(batch.mask) & VALID[..., None])
    garbage = np.where(rng.random((B, G, T)) < 0.5, np.nan, 1e30 * rng.standard_normal((B, G, T)))
    noisy = batch._replace(
        old_logp=jnp.where(ignored, garbage, batch.old_logp),
        correct=jnp.where(VALID, batch.correct, ~CORRECT),
        speed_reward=jnp.where(VALID & CORRECT, batch.speed_reward, jnp.nan),
    )
    noisy_logp = np.where(ignored, -garbage, logp).astype(np.float32)
    for cfg in (DRPOConfig(), DRPOConfig(kl_estimator="k1")):
        loss, metrics, grad = loss_and_grad(batch, logp, cfg)
        loss2, metrics2, grad2 = loss_and_grad(noisy, noisy_logp, cfg)
        assert loss == loss2
        np.testing.assert_array_equal(grad, grad2)
        for key, value in metrics.items():
            np.testing.assert_array_equal(value, metrics2[key], err_msg=key)


def test_jit_and_registry() -> None:
    batch, logp = make_batch(noise=0.3)
    cfg = DRPOConfig()
    eager, _ = drpo_loss(batch, jnp.asarray(logp), cfg)
    jitted, _ = jax.jit(get_algorithm("drpo").loss_fn, static_argnums=2)(batch, logp, cfg)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
    assert ALGORITHMS["drpo"].config_type is DRPOConfig
    with pytest.raises(ValueError, match="unknown RL algorithm"):
        get_algorithm("ppo")
    with pytest.raises(TypeError, match="DRPOConfig"):
        drpo_loss(batch, jnp.asarray(logp), GRPOConfig())


@pytest.mark.parametrize(
    "bad",
    [{"beta": -1.0}, {"tau": 0.0}, {"lam": -0.1}, {"delta": -1e-3}, {"lam": float("nan")},
     {"kl_estimator": "k2"}],
)  # fmt: skip
def test_config_validation(bad: dict) -> None:
    with pytest.raises(ValueError, match="DRPOConfig"):
        DRPOConfig(**bad)


def test_shape_mismatch_is_a_clear_error() -> None:
    batch, logp = make_batch(noise=0.0)
    with pytest.raises(ValueError, match="valid has shape"):
        drpo_loss(batch._replace(valid=batch.valid[:, :2]), jnp.asarray(logp), DRPOConfig())
    with pytest.raises(ValueError, match=r"logp must be \[B, G, T\]"):
        drpo_loss(batch, jnp.asarray(logp[0]), DRPOConfig())
