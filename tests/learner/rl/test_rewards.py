"""Speed-reward forms, GRPO's scalar reward, and verdict records turned into arrays and counts."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from learner.rl.rewards import (
    POWER_ALPHAS,
    UNJUDGED_VERDICTS,
    VERDICTS,
    RewardConfig,
    scalar_reward,
    speed_reward,
    verdict_arrays,
)

SPEEDUPS = np.array([1e-3, 0.25, 1.0, 1.7, 1e3])


def test_log_speed_reward() -> None:
    got = speed_reward(SPEEDUPS)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.log(SPEEDUPS), rtol=1e-6)
    assert speed_reward(1.0) == 0


@pytest.mark.parametrize("alpha", POWER_ALPHAS)
def test_power_speed_reward(alpha: float) -> None:
    got = RewardConfig(kind="power", alpha=alpha).speed_reward(SPEEDUPS)
    np.testing.assert_allclose(got, SPEEDUPS**alpha, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs", [{"kind": "sqrt"}, {"kind": "power", "alpha": 0.3}, {"alpha": 2.0}]
)
def test_bad_reward_form_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="speed reward"):
        RewardConfig(**kwargs)
    with pytest.raises(ValueError, match="speed reward"):
        speed_reward(SPEEDUPS, **kwargs)


@pytest.mark.parametrize("bad", [0.0, -2.0, np.nan, np.inf])
def test_bad_speedup_is_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="positive and finite"):
        speed_reward([1.0, bad])


def test_scalar_reward_scores_correct_kernels_only() -> None:
    correct = jnp.asarray([True, True, False, False])
    r_s = jnp.asarray([np.log(2.0), np.log(0.5), 3.0, np.nan], jnp.float32)
    got = np.asarray(scalar_reward(correct, r_s, speed_weight=0.2))
    np.testing.assert_allclose(got, [1 + 0.2 * np.log(2), 1 - 0.2 * np.log(2), 0, 0], rtol=1e-6)


def record(verdict: str, speedup: float | None = None, truncated: bool = False) -> dict:
    return {"verdict": verdict, "speedup_vs_eager": speedup, "truncated": truncated}


def test_verdicts_become_arrays_and_counts() -> None:
    records = [
        # mixed; the second correct kernel is untimed (CPU sandbox)
        record("correct", 2.0), record("wrong_output"), record("correct"), record("compile_error"),
        # all correct once a sandbox failure and a truncated (correct) completion are masked
        record("correct", 0.5), record("correct", 1.5), record("sandbox_error"),
        record("correct", 3.0, truncated=True),
        # all wrong; a bad problem says nothing about the kernel
        record("timeout"), record("wrong_output"), record("bad_problem"), record("runtime_error"),
        # nothing usable
        record("sandbox_error"), record("sandbox_error", truncated=True),
        record("correct", 1.2, truncated=True), record("bad_problem"),
    ]  # fmt: skip
    out = verdict_arrays(records, group_size=4)
    np.testing.assert_array_equal(
        out.valid, [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        out.correct, [[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    )
    np.testing.assert_allclose(out.speedup, [[2, 1, 2, 1], [0.5, 1.5, 1, 1], [1] * 4, [1] * 4])
    assert out.speedup.dtype == np.float32 and out.correct.dtype == bool
    assert out.counts == {
        "samples": 16,
        "correct": 4,
        "sandbox_failures": 5,
        "truncated": 3,
        "invalid": 7,
        "untimed_correct": 1,
        "all_correct_groups": 1,
        "all_wrong_groups": 1,
        "mixed_groups": 1,
        "no_valid_groups": 1,
    }
    # An untimed correct kernel beside a timed one is scored as its peer.
    assert speed_reward(out.speedup)[0, 2] == speed_reward(out.speedup)[0, 0]


def test_an_untimed_correct_kernel_takes_its_timed_peers_median() -> None:
    """Beside timed peers an untimed correct kernel is neither the group's slowest nor its
    fastest; with no timed peer (the CPU sandbox) correctness alone is rewarded (r_s = 0)."""
    records = [
        record("correct", 0.5), record("correct", 2.0), record("correct", 8.0),
        record("correct"), record("wrong_output", 9.0),
        record("correct"), record("correct"), record("wrong_output"), record("timeout"),
        record("correct", 4.0, truncated=True),
    ]  # fmt: skip
    out = verdict_arrays(records, group_size=5)
    np.testing.assert_allclose(out.speedup, [[0.5, 2, 8, 2, 1], [1, 1, 1, 1, 1]])
    assert (speed_reward(out.speedup)[1] == 0).all()
    assert out.counts["untimed_correct"] == 3


@pytest.mark.parametrize(
    ("records", "group_size", "message"),
    [
        ([record("correct")] * 3, 2, "groups of 2"),
        ([record("correct")], 0, "groups of 0"),
        ([{"verdict": "correct", "truncated": False}], 1, "lacks"),
        ([record("passed")], 1, "unknown verdict"),
        ([{**record("correct"), "truncated": "no"}], 1, "bool"),
        ([record("correct", 0.0)], 1, "positive and finite"),
        ([record("correct", float("nan"))], 1, "positive and finite"),
        ([record("correct", "fast")], 1, "positive and finite"),
    ],
)
def test_bad_records_are_rejected(records: list, group_size: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verdict_arrays(records, group_size)


def test_verdict_names_follow_the_sandbox_contract() -> None:
    result = pytest.importorskip("sandbox.result")
    assert set(result.VERDICTS) == VERDICTS
    assert result.INFRASTRUCTURE_VERDICTS == UNJUDGED_VERDICTS
