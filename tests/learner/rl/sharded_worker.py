"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 by test_rl_trainer.py.

One RL update (DRPO, and GRPO with its reference KL) on a (fsdp=4, tp=2) mesh and on a
single device, from the same state and batch, and on the mesh again with two micro-batches
(gradient accumulation); prints the largest differences as JSON.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from learner.rl.common import RLBatch
from learner.rl.config import RLConfig
from learner.rl.update import make_rl_step
from learner.sharding import make_mesh
from learner.train.config import load_config
from learner.train.policy import qwen2_config
from learner.train.state import create_train_state, host_params, state_shardings

B, G, T, W = 4, 4, 6, 8


def batch_arrays() -> tuple[RLBatch, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    n = B * G
    lengths = rng.integers(1, T + 1, size=n)
    prompt_lengths = rng.integers(2, W + 1, size=n)
    tokens = np.zeros((n, W + T), np.int32)
    for row in range(n):
        tokens[row, W - prompt_lengths[row] : W] = rng.integers(1, 100, prompt_lengths[row])
        tokens[row, W : W + lengths[row]] = rng.integers(1, 100, lengths[row])
    starts = (W - prompt_lengths).astype(np.int32)
    mask = (np.arange(T)[None, :] < lengths[:, None]).reshape(B, G, T)
    correct = rng.random((B, G)) < 0.5
    correct[0] = [True, False, True, False]  # at least one mixed group
    valid = rng.random((B, G)) < 0.9
    batch = RLBatch(
        old_logp=(-rng.random((B, G, T)) * 3).astype(np.float32),
        mask=mask,
        valid=valid,
        correct=correct,
        speed_reward=np.log(rng.uniform(0.5, 2.0, (B, G))).astype(np.float32),
    )
    return batch, tokens, starts


def run(
    mesh, cfg, qcfg, rl: RLConfig, accum: int = 1
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    state = create_train_state(cfg, qcfg, mesh)
    reference = None
    if rl.algorithm == "grpo":  # a reference policy other than the current one
        reference = jax.tree.map(lambda x: x * 0.9, state.params)
    step = make_rl_step(
        state_shardings(state, mesh), width=W, algorithm=rl.algorithm,
        loss_config=rl.loss_config(), chunk=4, donate=False, behaviour=False,
        reference=reference is not None, accum=accum,
    )  # fmt: skip
    batch, tokens, starts = batch_arrays()
    with jax.set_mesh(mesh):
        new, metrics = step(state, batch, tokens, starts, None, reference)
    return host_params(new), {k: float(v) for k, v in jax.device_get(metrics).items()}


def main() -> None:
    cfg = load_config(
        "tiny-cpu", ["model.vocab_size=128", "model.tokenizer=", "optim.warmup_steps=0"]
    )
    qcfg = qwen2_config(cfg.model)
    report: dict[str, object] = {"devices": jax.device_count()}
    for algorithm in ("drpo", "grpo"):
        rl = RLConfig(algorithm=algorithm, drpo_delta=0.0)  # the KL penalty is active
        single = run(make_mesh(1, 1, devices=jax.devices()[:1]), cfg, qcfg, rl)
        sharded = run(make_mesh(4, 2), cfg, qcfg, rl)
        accumulated = run(make_mesh(4, 2), cfg, qcfg, rl, accum=2)
        start = host_params(create_train_state(cfg, qcfg, make_mesh(1, 1, jax.devices()[:1])))
        report[algorithm] = {
            "param_diff": max(float(np.abs(single[0][k] - sharded[0][k]).max()) for k in single[0]),
            "param_change": max(float(np.abs(single[0][k] - start[k]).max()) for k in start),
            "metric_diff": {k: abs(single[1][k] - sharded[1][k]) for k in single[1]},
            "accum_param_diff": max(
                float(np.abs(single[0][k] - accumulated[0][k]).max()) for k in single[0]
            ),
            "accum_metric_diff": {k: abs(single[1][k] - accumulated[1][k]) for k in single[1]},
            "loss": single[1]["loss"],
            "grad_norm": single[1]["grad_norm"],
            "metrics": single[1],
        }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
