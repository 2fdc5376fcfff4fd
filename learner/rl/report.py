"""One RL step's figures for metrics.jsonl and the progress bar (pure, host-side)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from learner.rl.rollout import Assembled

# Counts summed over the run (also kept in checkpoints, so a resumed run's totals continue).
TOTALS = (
    "samples",
    "correct",
    "sandbox_failures",
    "truncated",
    "unparsable",
    "cached",
    "sent",
    "all_correct_groups",
    "all_wrong_groups",
)


def reward_figures(assembled: Assembled) -> dict[str, float]:
    """Correctness and speed of one step's samples (over the valid ones)."""
    batch = assembled.batch
    valid = np.asarray(batch.valid, bool)
    correct = np.asarray(batch.correct, bool)
    speed = np.asarray(batch.speed_reward, np.float64)
    n_valid = int(valid.sum())
    reward = np.where(correct, 1.0 + speed, 0.0)
    speedups = assembled.speedups
    return {
        "correct_mean": float(correct.sum() / n_valid) if n_valid else math.nan,
        "reward_mean": float(reward[valid].mean()) if n_valid else math.nan,
        "speedup_mean": float(speedups.mean()) if speedups.size else math.nan,
        "speedup_geomean": float(np.exp(np.log(speedups).mean())) if speedups.size else math.nan,
        "timed_correct": float(speedups.size),
    }


def step_figures(
    assembled: Assembled,
    update: Mapping[str, Any],
    times: Mapping[str, float],
    verify_seconds: float,
) -> dict[str, float]:
    """Everything logged for one step: the loss's metrics, rewards, counts, times."""
    figures: dict[str, float] = {k: float(np.asarray(v)) for k, v in update.items()}
    figures.update(reward_figures(assembled))
    figures.update({f"n_{k}": float(v) for k, v in assembled.counts.items()})
    sent = assembled.counts.get("sent", 0)
    figures["verifications_per_s"] = sent / verify_seconds if verify_seconds > 0 else math.nan
    figures.update({f"time_{k}_s": float(v) for k, v in times.items()})
    figures["sandbox_wait_s"] = float(times.get("waiting", 0.0))
    return figures


def add_totals(totals: dict[str, float], counts: Mapping[str, Any]) -> dict[str, float]:
    """Run totals after one more step's counts."""
    return {k: float(totals.get(k, 0.0)) + float(counts.get(k, 0.0)) for k in TOTALS}
