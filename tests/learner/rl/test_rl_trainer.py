"""The RL trainer: no torch in the learner, a sharded update equals the single-device one,
config errors before compute, and an end-to-end run through a real CPU sandbox server that
raises the policy's correctness."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from learner.train.metrics import read_metrics
from tests.learner.eight_devices import run_on_eight_devices

from .conftest import REPO_ROOT, run_worker

LEARNER_MODULES = (
    "learner.rl.trainer",
    "learner.rl.rollout",
    "learner.rl.reward_client",
    "learner.rl.update",
    "learner.train.verify",
    "sandbox.client",
    "sandbox.gpu_gate",
)


def test_the_learner_imports_neither_torch_nor_triton(tmp_path: Path) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {LEARNER_MODULES!r}: importlib.import_module(name)\n"
        "from learner.rl.gpu_share import open_share\n"
        f"with open_share({str(tmp_path)!r}).hold(): pass\n"
        "print([m for m in ('torch', 'triton') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_sharded_update_equals_the_single_device_update() -> None:
    report = run_on_eight_devices("tests.learner.rl.sharded_worker")
    assert report["devices"] == 8
    for algorithm in ("drpo", "grpo"):
        result = report[algorithm]
        assert result["grad_norm"] > 0 and result["param_change"] > 1e-3, result
        # Adam's first step moves every parameter by about lr = 3e-3: agreement to 1e-4 of
        # that leaves no room for a wrongly sharded gradient.
        assert result["param_diff"] < 1e-4 * 3, result
        assert result["accum_param_diff"] < 1e-4 * 3, result  # two micro-batches, sharded
        for key in ("metric_diff", "accum_metric_diff"):
            for name, diff in result[key].items():
                scale = max(1.0, abs(result["metrics"][name]))
                assert diff <= 1e-4 * scale, (algorithm, key, name, diff)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.grad_accum=3"], "grad_accum=3 must divide rl.prompts_per_step=2"),
        ([], "model.path"),
        (["model.path=.", "data.programs=nope.jsonl"], "no such file: nope.jsonl"),
    ],
)
def test_config_errors_come_before_anything_is_written(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    from learner.rl.trainer import run_rl
    from learner.train.config import ConfigError, load_config

    cfg = load_config("tiny-cpu", [f"run_dir={tmp_path}/run", *overrides])
    with pytest.raises(ConfigError, match=message):
        run_rl(cfg)
    assert not (tmp_path / "run").exists()


# -- end to end ------------------------------------------------------------------------------


def rl_then_score(root: Path, server: str, steps: int, samples: int, *extra: str) -> dict:
    """Score the SFT policy, train RL for `steps`, score the result (same prompts, seeds)."""
    run_dir = root / f"rl-{steps}"
    out = run_worker(
        "rlscore", str(root), str(run_dir), server, str(samples), f"optim.total_steps={steps}",
        *extra,
    )  # fmt: skip
    return {
        **out["result"],
        "imported": out["imported"],
        "metrics": [r for r in read_metrics(run_dir) if "rl/loss" in r],
    }


def check_run(out: dict, steps: int) -> None:
    assert out["imported"] == {"torch": False, "triton": False}
    assert out["summary"]["steps"] == steps
    totals = out["summary"]["totals"]
    assert totals["sent"] > 0 and totals["sandbox_failures"] == 0, totals
    assert totals["cached"] > 0, "identical answers must come from the cache"
    assert len(out["metrics"]) == steps
    for record in out["metrics"]:
        assert record["rl/logprob_gap_max"] < 1e-3, "sampler and trainer disagree"
        assert record["rl/n_samples"] == 16


def test_rl_raises_correctness_through_a_real_sandbox(
    sft_policy: Path, sandbox_server: str
) -> None:
    """A short run: 10 steps of 4 prompts x 4 samples (figures in the module's report)."""
    out = rl_then_score(sft_policy, sandbox_server, 10, 4)
    check_run(out, 10)
    before, after = out["before"]["correct"], out["after"]["correct"]
    print(f"correctness before {before:.3f}, after {after:.3f}")
    assert 0.2 <= before <= 0.8, "the SFT'd policy should be right part of the time"
    assert after >= before + 0.1, (before, after)


@pytest.mark.slow
def test_rl_raises_correctness_further_with_more_steps_and_overlap(
    sft_policy: Path, sandbox_server: str
) -> None:
    """The longer version: 30 steps at a lower learning rate, verification of each step
    overlapped with sampling the next (one step off-policy)."""
    out = rl_then_score(sft_policy, sandbox_server, 30, 8, "rl.overlap=on", "optim.lr=2e-4")
    check_run(out, 30)
    before, after = out["before"]["correct"], out["after"]["correct"]
    print(f"correctness before {before:.3f}, after {after:.3f}")
    assert after >= before + 0.15, (before, after)
    assert any(r["rl/off_policy"] == 1.0 for r in out["metrics"]), "overlap never sampled ahead"


# -- the GPU gate ----------------------------------------------------------------------------


def test_the_learners_hold_keeps_timed_loops_out(tmp_path: Path) -> None:
    import fcntl

    from learner.rl.gpu_share import GpuShare, open_share

    share = open_share(str(tmp_path))
    assert isinstance(share, GpuShare)
    with open(tmp_path / "gpu-gate.lock", "ab") as gate:
        # What a timed loop's exclusive hold needs is refused while the learner computes...
        with share.hold(), pytest.raises(BlockingIOError):
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ...and granted once the phase ends
        fcntl.flock(gate, fcntl.LOCK_UN)
    assert open_share("").directory == ""


def test_auto_finds_the_job_root_of_the_sandbox_this_process_started(tmp_path: Path) -> None:
    from learner.rl.gpu_share import local_gate_dir
    from learner.train.config import ConfigError

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        with pytest.raises(ConfigError, match="found 0 job roots"):
            local_gate_dir(str(tmp_path))
        (tmp_path / f"runner-{child.pid}-abc123").mkdir()
        (tmp_path / "runner-1-other").mkdir()  # not a child of this process
        assert local_gate_dir(str(tmp_path)) == str(tmp_path / f"runner-{child.pid}-abc123")
        (tmp_path / f"runner-{child.pid}-abc123" / "gpu-0").mkdir()
        with pytest.raises(ConfigError, match="several GPUs"):
            local_gate_dir(str(tmp_path))
    finally:
        child.communicate(b"")


# -- log-prob consistency --------------------------------------------------------------------


def test_recomputed_logprobs_match_the_samplers_and_a_misaligned_layout_is_caught() -> None:
    import jax.numpy as jnp
    import numpy as np

    from learner.generate.sampler import Sampler, SamplingParams
    from learner.rl.rollout import token_arrays
    from learner.rl.trainer import LogprobGapError, check_logprob_gap
    from learner.rl.update import completion_logprobs, logprob_gap

    from ..conftest import random_tiny_model

    model = random_tiny_model()
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5]]
    sampler = Sampler(model, pad_id=0, prompt_bucket=8)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)
    completions = sampler.generate(prompts, params, seeds=[0, 1, 2])
    width = 8
    tokens, starts = token_arrays(prompts, [c.tokens for c in completions], width, 6, 0)
    old = np.zeros((3, 6), np.float32)
    mask = np.zeros((3, 6), bool)
    for row, c in enumerate(completions):
        old[row, : len(c.logprobs)] = c.logprobs
        mask[row, : len(c.logprobs)] = True

    logp = completion_logprobs(model, jnp.asarray(tokens), jnp.asarray(starts), width)
    gap = {k: float(v) for k, v in logprob_gap(logp, old, mask).items()}
    assert gap["logprob_gap_max"] < 1e-4, gap
    check_logprob_gap(1, gap, 1e-3)

    # One slot off: each token scored at its predecessor's position.
    shifted = completion_logprobs(model, jnp.asarray(tokens), jnp.asarray(starts), width - 1)
    bad = {k: float(v) for k, v in logprob_gap(shifted[:, :6], old, mask).items()}
    with pytest.raises(LogprobGapError, match="rl.max_logprob_gap"):
        check_logprob_gap(2, bad, 1e-3)


def test_a_run_whose_samples_go_unjudged_stops_with_the_reason() -> None:
    """Masked samples teach nothing: a fleet that judges none of them (refused requests,
    an unreachable server) must stop the run, not let it train on nothing."""
    from learner.rl.trainer import STARVED_STEPS, SandboxStarvedError, starved_streak

    starved = {"samples": 16, "sandbox_failures": 12}
    fine = {"samples": 16, "sandbox_failures": 1}
    streak = 0
    for step in range(1, STARVED_STEPS):
        streak = starved_streak(streak, starved, step)
    assert starved_streak(streak, fine, STARVED_STEPS) == 0  # one judged step resets it
    with pytest.raises(SandboxStarvedError, match="could not judge 12 of 16"):
        for step in range(1, STARVED_STEPS + 1):
            streak = starved_streak(streak, starved, step)
