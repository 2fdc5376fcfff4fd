"""The RL objectives by name, so a trainer switches algorithm with one configuration key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from learner.rl.common import RLBatch
from learner.rl.drpo import DRPOConfig, drpo_loss
from learner.rl.grpo import GRPOConfig, grpo_loss

LossFn = Callable[[RLBatch, jax.Array, Any], tuple[jax.Array, dict[str, jax.Array]]]


class Algorithm(NamedTuple):
    """`loss_fn(batch, logp, config) -> (loss, metrics)` and the frozen config type it takes."""

    loss_fn: LossFn
    config_type: type


ALGORITHMS: dict[str, Algorithm] = {
    "drpo": Algorithm(drpo_loss, DRPOConfig),
    "grpo": Algorithm(grpo_loss, GRPOConfig),
}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm called `name`, or a ValueError listing the known ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]
