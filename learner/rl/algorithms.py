"""The RL objectives by name, so a trainer switches algorithm with one configuration key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from learner.rl.common import RLBatch
from learner.rl.drpo import DRPOConfig, drpo_coupling, drpo_loss, drpo_micro_loss
from learner.rl.grpo import GRPOConfig, grpo_coupling, grpo_loss, grpo_micro_loss

LossFn = Callable[[RLBatch, jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]
CouplingFn = Callable[[RLBatch, Any, Any], Any]
MicroLossFn = Callable[[RLBatch, jax.Array, Any, Any], jax.Array]


class Algorithm(NamedTuple):
    """`loss_fn(batch, logp, config) -> (loss, metrics)` and the frozen config type it takes;
    for gradient accumulation over micro-batches of whole prompt groups,
    `coupling_fn(batch, logp, config)` (the whole batch's sums, no gradient) and
    `micro_loss_fn(micro_batch, micro_logp, config, coupling)`, whose gradients sum to
    `loss_fn`'s. `coupling_reads_logp`: whether the coupling needs the current policy's
    log-probs (then an accumulated step first scores the batch without gradient)."""

    loss_fn: LossFn
    config_type: type
    coupling_fn: CouplingFn
    micro_loss_fn: MicroLossFn
    coupling_reads_logp: bool


ALGORITHMS: dict[str, Algorithm] = {
    "drpo": Algorithm(drpo_loss, DRPOConfig, drpo_coupling, drpo_micro_loss, True),
    "grpo": Algorithm(grpo_loss, GRPOConfig, grpo_coupling, grpo_micro_loss, False),
}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called `name`, or a ValueError listing the known ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
