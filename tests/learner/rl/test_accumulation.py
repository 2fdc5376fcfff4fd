"""Gradient accumulation is exact: micro-batches of whole prompt groups give the full batch's
gradient and metrics, for DRPO (coupled through the batch KL) and GRPO, at the loss and
through the jitted update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from learner.rl.algorithms import get_algorithm
from learner.rl.common import RLBatch
from learner.rl.drpo import DRPOConfig, drpo_coupling, drpo_loss
from learner.rl.grpo import GRPOConfig

B, G, T = 8, 4, 6
# Per prompt: mixed; all correct; all wrong; mixed once two invalid samples are dropped;
# all wrong once an invalid correct sample and an empty correct one are dropped; mixed;
# nothing usable; mixed with a truncated (invalid) sample.
CORRECT = np.array(
    [
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [0, 0, 0, 0],
        [1, 0, 1, 0],
        [1, 0, 0, 1],
        [0, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ],
    bool,
)
VALID = np.array(
    [
        [1, 1, 1, 1],
        [1, 1, 1, 1],
        [1, 1, 1, 1],
        [1, 1, 0, 0],
        [0, 1, 1, 1],
        [1, 1, 1, 1],
        [0, 0, 0, 0],
        [1, 0, 1, 1],
    ],
    bool,
)
LENGTHS = np.array(
    [
        [6, 3, 1, 5],
        [2, 6, 4, 3],
        [5, 5, 2, 1],
        [4, 2, 6, 3],
        [3, 6, 2, 0],
        [1, 6, 6, 2],
        [3, 3, 3, 3],
        [6, 4, 2, 5],
    ]
)


def make_batch(noise: float, seed: int = 0) -> tuple[RLBatch, jax.Array]:
    """A batch whose uncounted entries hold NaN, and the current log-probs."""
    rng = np.random.default_rng(seed)
    logp = -rng.uniform(0.05, 3.0, (B, G, T))
    old_logp = logp + noise * (rng.standard_normal((B, G, T)) + 0.5)
    ref_logp = logp + 0.2 * rng.standard_normal((B, G, T))
    mask = np.arange(T) < LENGTHS[..., None]
    counted = mask & VALID[..., None]
    old_logp = np.where(counted, old_logp, np.nan)
    speed = np.exp(rng.uniform(-2, 2, (B, G)))
    batch = RLBatch(
        old_logp=jnp.asarray(old_logp, jnp.float32),
        mask=jnp.asarray(mask),
        valid=jnp.asarray(VALID),
        correct=jnp.asarray(CORRECT),
        speed_reward=jnp.asarray(np.log(speed), jnp.float32),
        ref_logp=jnp.asarray(ref_logp, jnp.float32),
    )
    return batch, jnp.asarray(logp, jnp.float32)


def rows(batch: RLBatch, start: int, stop: int) -> RLBatch:
    return jax.tree.map(lambda x: x[start:stop], batch)


def accumulated_grad(
    name: str, batch: RLBatch, logp: jax.Array, cfg, accum: int, *, local: bool = False
) -> tuple[jax.Array, jax.Array]:
    """(d Σ micro losses / d logp, Σ micro losses). `local`: each micro-batch's coupling
    from itself alone (the wrong way, to show the test can tell)."""
    algo = get_algorithm(name)
    coupling = algo.coupling_fn(batch, logp, cfg)
    size = B // accum
    grads, total = [], 0.0
    for k in range(accum):
        part, part_logp = rows(batch, k * size, (k + 1) * size), logp[k * size : (k + 1) * size]
        if local:
            coupling = algo.coupling_fn(part, part_logp, cfg)
        value, grad = jax.value_and_grad(algo.micro_loss_fn, argnums=1)(
            part, part_logp, cfg, coupling
        )
        grads.append(grad)
        total += value
    return jnp.concatenate(grads), total


def full_grad(name: str, batch: RLBatch, logp: jax.Array, cfg) -> tuple[jax.Array, dict]:
    loss_fn = get_algorithm(name).loss_fn
    grad, metrics = jax.grad(lambda lp: loss_fn(batch, lp, cfg), has_aux=True)(logp)
    return grad, metrics


CASES = [
    ("drpo", DRPOConfig(), 0.3),  # KL well past δ: the coupled penalty is active
    ("drpo", DRPOConfig(kl_estimator="k1", delta=0.0), 0.3),
    ("drpo", DRPOConfig(), 0.0),  # KL = 0, inside the budget
    ("grpo", GRPOConfig(), 0.3),
    ("grpo", GRPOConfig(kl_coef=0.0), 0.3),
]


@pytest.mark.parametrize(("name", "cfg", "noise"), CASES)
@pytest.mark.parametrize("accum", [1, 2, 4])
def test_micro_batch_gradients_sum_to_the_full_batch_gradient(name, cfg, noise, accum) -> None:
    batch, logp = make_batch(noise)
    expected, metrics = full_grad(name, batch, logp, cfg)
    if name == "drpo" and noise:
        assert float(metrics["penalty"]) > 1e-3 and float(metrics["kl"]) > 10 * cfg.delta
    got, total = accumulated_grad(name, batch, logp, cfg, accum)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-7)
    assert np.abs(np.asarray(expected)).max() > 1e-3
    if name == "grpo":  # a plain sum over prompts: the values add up too
        np.testing.assert_allclose(float(total), float(metrics["loss"]), rtol=1e-5, atol=1e-7)


def test_a_micro_batch_alone_does_not_know_the_batch_kl() -> None:
    """Coupling each micro-batch only to itself gives another gradient: the test can fail."""
    cfg = DRPOConfig()
    batch, logp = make_batch(0.3)
    expected, _ = full_grad("drpo", batch, logp, cfg)
    wrong, _ = accumulated_grad("drpo", batch, logp, cfg, 2, local=True)
    assert np.abs(np.asarray(wrong) - np.asarray(expected)).max() > 1e-3


@pytest.mark.parametrize("accum", [2, 4])
def test_drpo_coupling_adds_up_over_micro_batches(accum: int) -> None:
    cfg = DRPOConfig()
    batch, logp = make_batch(0.3)
    size = B // accum
    parts = [
        drpo_coupling(rows(batch, k * size, (k + 1) * size), logp[k * size : (k + 1) * size], cfg)
        for k in range(accum)
    ]
    summed = jax.tree.map(lambda *xs: sum(xs), *parts)
    full = drpo_coupling(batch, logp, cfg)
    for got, want in zip(summed, full, strict=True):
        np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    _, metrics = drpo_loss(batch, logp, cfg)
    np.testing.assert_allclose(float(full.kl_sum / full.n_tokens), float(metrics["kl"]), rtol=1e-6)


def test_micro_loss_checks_its_config() -> None:
    batch, logp = make_batch(0.3)
    drpo, grpo = get_algorithm("drpo"), get_algorithm("grpo")
    coupling = drpo.coupling_fn(batch, logp, DRPOConfig())
    with pytest.raises(TypeError, match="DRPOConfig"):
        drpo.micro_loss_fn(batch, logp, GRPOConfig(), coupling)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.micro_loss_fn(batch._replace(ref_logp=None), logp, GRPOConfig(), coupling)


# -- through the jitted update ---------------------------------------------------------------

UB, UW = 4, 8  # prompts and prompt width of the update test (G, T as above)


@pytest.fixture(scope="module")
def tiny_state():
    from learner.sharding import make_mesh
    from learner.train.config import load_config
    from learner.train.policy import qwen2_config
    from learner.train.state import create_train_state

    cfg = load_config(
        "tiny-cpu", ["model.vocab_size=128", "model.tokenizer=", "optim.warmup_steps=0"]
    )
    mesh = make_mesh(1, 1, devices=jax.devices()[:1])
    state = create_train_state(cfg, qwen2_config(cfg.model), mesh)
    # Plain SGD with rate 1: the new parameters are the old minus the gradient, so comparing
    # them compares gradients. (Adam's first step, lr·g/(|g| + eps), would magnify float32
    # rounding on entries whose gradient is near eps.)
    sgd = optax.sgd(1.0)
    return state.replace(tx=sgd, opt_state=sgd.init(state.params)), mesh


def update_inputs(state) -> tuple[RLBatch, np.ndarray, np.ndarray]:
    """Prompts 0 and 2 mixed, 1 all correct, 3 all wrong; an invalid and an empty sample;
    behaviour log-probs near the current policy's, so the DRPO objective and KL both act."""
    from learner.rl.update import completion_logprobs

    rng = np.random.default_rng(1)
    n = UB * G
    lengths = rng.integers(1, T + 1, size=n)
    lengths[5] = 0
    prompt_lengths = rng.integers(2, UW + 1, size=n)
    tokens = np.zeros((n, UW + T), np.int32)
    for row in range(n):
        tokens[row, UW - prompt_lengths[row] : UW] = rng.integers(1, 100, prompt_lengths[row])
        tokens[row, UW : UW + lengths[row]] = rng.integers(1, 100, lengths[row])
    starts = (UW - prompt_lengths).astype(np.int32)
    current = completion_logprobs(state.model(), jnp.asarray(tokens), jnp.asarray(starts), UW)
    mask = (np.arange(T)[None, :] < lengths[:, None]).reshape(UB, G, T)
    old_logp = np.asarray(current).reshape(UB, G, T) + 0.1 * rng.standard_normal((UB, G, T))
    correct = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 0], [0, 0, 0, 0]], bool)
    valid = np.ones((UB, G), bool)
    valid[2, 0] = False
    batch = RLBatch(
        old_logp=old_logp.astype(np.float32),
        mask=mask,
        valid=valid,
        correct=correct,
        speed_reward=np.log(rng.uniform(0.5, 2.0, (UB, G))).astype(np.float32),
    )
    return batch, tokens, starts


def one_update(state, mesh, algorithm: str, accum: int, *, off_policy: bool):
    from learner.rl.config import RLConfig
    from learner.rl.update import make_rl_step
    from learner.train.state import host_params, state_shardings

    rl = RLConfig(algorithm=algorithm, drpo_delta=0.0)
    reference = jax.tree.map(lambda x: x * 0.9, state.params) if algorithm == "grpo" else None
    behaviour = jax.tree.map(lambda x: x * 0.99, state.params) if off_policy else None
    step = make_rl_step(
        state_shardings(state, mesh), width=UW, algorithm=algorithm,
        loss_config=rl.loss_config(), chunk=4, donate=False, behaviour=off_policy,
        reference=reference is not None, accum=accum,
    )  # fmt: skip
    batch, tokens, starts = update_inputs(state)
    with jax.set_mesh(mesh):
        new, metrics = step(state, batch, tokens, starts, behaviour, reference)
    return host_params(new), {k: float(v) for k, v in jax.device_get(metrics).items()}


@pytest.mark.parametrize(("algorithm", "off_policy"), [("drpo", False), ("grpo", True)])
def test_an_accumulated_update_equals_the_single_batch_update(
    tiny_state, algorithm: str, off_policy: bool
) -> None:
    state, mesh = tiny_state
    from learner.train.state import host_params

    start = host_params(state)
    params_1, metrics_1 = one_update(state, mesh, algorithm, 1, off_policy=off_policy)
    if algorithm == "drpo":
        assert metrics_1["penalty"] > 0 and metrics_1["n_contributing"] == 2
    step_1 = {k: params_1[k] - start[k] for k in start}  # minus the gradient
    scale = max(float(np.abs(v).max()) for v in step_1.values())
    assert scale > 1e-4 and metrics_1["grad_norm"] > 0
    for accum in (2, 4):
        params_a, metrics_a = one_update(state, mesh, algorithm, accum, off_policy=off_policy)
        for key in start:
            np.testing.assert_allclose(
                params_a[key] - start[key], step_1[key], rtol=1e-4, atol=1e-5 * scale
            )
        assert metrics_a.keys() == metrics_1.keys()
        for key, value in metrics_1.items():
            assert metrics_a[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (accum, key)


def test_an_update_refuses_micro_batches_that_split_a_group(tiny_state) -> None:
    state, mesh = tiny_state
    with pytest.raises(ValueError, match="must divide"):
        one_update(state, mesh, "drpo", 3, off_policy=False)
