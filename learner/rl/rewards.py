"""From sandbox verdicts to the arrays the RL objectives read: correctness, speed reward, validity.

The speed reward r_s is computed here, outside the losses, so the objectives do not depend on
its form. The paper compares r_s = log(t_torch / t_triton) with (t_torch / t_triton)^α for
α ∈ {0.25, 0.5, 0.75, 1}; the log form is its default and ours.

Host-side and pure: plain records in, NumPy arrays out.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb

SPEED_REWARD_KINDS = ("log", "power")
POWER_ALPHAS = (0.25, 0.5, 0.75, 1.0)

# The sandbox's verdicts, lower case, read from the wire contract (protobuf only: no torch).
VERDICTS = frozenset(
    value.name.lower()
    for value in pb.Verdict.DESCRIPTOR.values
    if value.name != "VERDICT_UNSPECIFIED"
)
# Verdicts that say nothing about the kernel (an unreachable server also arrives as
# `sandbox_error`): the sample is masked out of the loss, never scored as a wrong kernel.
UNJUDGED_VERDICTS = frozenset({"sandbox_error", "bad_problem"})


def _check_speed_reward(kind: str, alpha: float) -> None:
    if kind not in SPEED_REWARD_KINDS:
        raise ValueError(f"speed reward kind {kind!r}: choose one of {SPEED_REWARD_KINDS}")
    if alpha not in POWER_ALPHAS:
        raise ValueError(f"speed reward alpha {alpha!r}: choose one of {POWER_ALPHAS}")


def speed_reward(speedup: Any, kind: str = "log", alpha: float = 0.5) -> np.ndarray:
    """r_s = log(speedup) (kind "log") or speedup**alpha (kind "power"), as float32.

    `speedup` is t_torch / t_triton, positive and finite; `alpha` is read only by "power"
    but must be one of POWER_ALPHAS either way.
    """
    _check_speed_reward(kind, alpha)
    speedup = np.asarray(speedup, dtype=np.float64)
    bad = ~(np.isfinite(speedup) & (speedup > 0))
    if bad.any():
        raise ValueError(f"speedups must be positive and finite, got {speedup[bad]}")
    reward = np.log(speedup) if kind == "log" else speedup**alpha
    return reward.astype(np.float32)


@dataclass(frozen=True)
class RewardConfig:
    """The speed-reward form: "log" (the default) or "power" with exponent `alpha`."""

    kind: str = "log"
    alpha: float = 0.5

    def __post_init__(self) -> None:
        _check_speed_reward(self.kind, self.alpha)

    def speed_reward(self, speedup: Any) -> np.ndarray:
        return speed_reward(speedup, self.kind, self.alpha)


def scalar_reward(correct: jax.Array, speed_reward: jax.Array, speed_weight: float) -> jax.Array:
    """GRPO's one reward per sample: R = correct · (1 + w · r_s).

    A wrong kernel scores 0, a correct one 1 plus the weighted speed reward. With the log form
    and w = 0.2, a correct kernel outscores every wrong one while its speedup stays within
    e^±5 (1/148 to 148); DRPO needs no such weight since it keeps the two rewards apart.
    """
    correct = correct.astype(bool)
    r_s = jnp.where(correct, speed_reward, 0.0).astype(jnp.float32)
    return jnp.where(correct, 1.0 + speed_weight * r_s, 0.0)


class VerdictArrays(NamedTuple):
    """[B,G] arrays for `RLBatch` (correct, speedup, valid) and counts for the step's metrics."""

    correct: np.ndarray
    speedup: np.ndarray
    valid: np.ndarray
    counts: dict[str, int]


def _record_fields(index: int, record: Mapping[str, Any]) -> tuple[str, float | None, bool]:
    """(verdict, speedup or None, truncated) of one record, or a ValueError naming it."""
    missing = {"verdict", "speedup_vs_eager", "truncated"} - set(record)
    if missing:
        raise ValueError(f"verdict record {index} lacks {sorted(missing)}")
    verdict, speedup, truncated = (
        record["verdict"],
        record["speedup_vs_eager"],
        record["truncated"],
    )
    if verdict not in VERDICTS:
        raise ValueError(f"verdict record {index}: unknown verdict {verdict!r}")
    if not isinstance(truncated, bool | np.bool_):
        raise ValueError(f"verdict record {index}: truncated must be a bool, got {truncated!r}")
    if speedup is not None and not (
        isinstance(speedup, numbers.Real) and math.isfinite(speedup) and speedup > 0
    ):
        raise ValueError(f"verdict record {index}: speedup {speedup!r} is not positive and finite")
    return verdict, speedup, bool(truncated)


def fill_untimed(speedup: np.ndarray, timed: np.ndarray, untimed: np.ndarray) -> np.ndarray:
    """[B,G] speedups with each group's `untimed` entries set to the median of its `timed`
    ones (unchanged where a group has none timed). A kernel the sandbox judged correct but
    could not time (a timing loop cut short, a GPU too busy for a fair figure) is not
    thereby slower or faster than its peers."""
    out = speedup.astype(np.float32, copy=True)
    for group in np.flatnonzero(timed.any(axis=1) & untimed.any(axis=1)):
        out[group, untimed[group]] = np.median(speedup[group, timed[group]])
    return out


def verdict_arrays(records: Sequence[Mapping[str, Any]], group_size: int) -> VerdictArrays:
    """Turn B·G verdict records, prompt-major (G consecutive records per prompt), into arrays.

    A record holds `verdict` (the sandbox's, lower case), `speedup_vs_eager` (float or None)
    and `truncated` (the completion hit the length limit). A sample is valid unless its
    verdict is unjudged (`UNJUDGED_VERDICTS`) or it was truncated; an invalid sample is
    neither correct nor wrong. A correct kernel without a timing takes the median speedup
    of its group's timed correct kernels (`fill_untimed`): neither favoured nor penalised
    beside them for a timing it did not get. With no timed peer (the CPU sandbox does not
    time) it gets 1.0, hence r_s = 0 with the log form: correctness alone is rewarded.
    Wrong and invalid samples hold 1.0; the objectives never read it.

    counts: samples, correct (valid ones), sandbox_failures (unjudged verdicts), truncated,
    invalid (either of the two, each sample once), untimed_correct, and per prompt over its
    valid samples: all_correct_groups, all_wrong_groups, mixed_groups, no_valid_groups.
    """
    if group_size < 1 or len(records) % group_size:
        raise ValueError(f"{len(records)} records do not split into groups of {group_size}")
    fields = [_record_fields(i, record) for i, record in enumerate(records)]
    unjudged = np.array([v in UNJUDGED_VERDICTS for v, _, _ in fields], dtype=bool)
    truncated = np.array([t for _, _, t in fields], dtype=bool)
    valid = ~unjudged & ~truncated
    correct = valid & np.array([v == "correct" for v, _, _ in fields], dtype=bool)
    timed = np.array([s is not None for _, s, _ in fields], dtype=bool)
    speedup = np.array([1.0 if s is None else s for _, s, _ in fields], dtype=np.float32)
    speedup = np.where(correct, speedup, np.float32(1.0))
    shape = (len(records) // group_size, group_size)
    correct, speedup, valid = correct.reshape(shape), speedup.reshape(shape), valid.reshape(shape)
    speedup = fill_untimed(speedup, correct & timed.reshape(shape), correct & ~timed.reshape(shape))
    has_pos, has_neg = correct.any(axis=1), (valid & ~correct).any(axis=1)
    counts = {
        "samples": len(records),
        "correct": int(correct.sum()),
        "sandbox_failures": int(unjudged.sum()),
        "truncated": int(truncated.sum()),
        "invalid": int((~valid).sum()),
        "untimed_correct": int((correct.ravel() & ~timed).sum()),
        "all_correct_groups": int((has_pos & ~has_neg).sum()),
        "all_wrong_groups": int((~has_pos & has_neg).sum()),
        "mixed_groups": int((has_pos & has_neg).sum()),
        "no_valid_groups": int((~has_pos & ~has_neg).sum()),
    }
    return VerdictArrays(correct, speedup, valid, counts)
