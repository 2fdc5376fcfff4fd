"""SFT: the loss on completion tokens goes down, accumulation is exact, the schedule is the
configured one, and held-out pass@1 runs end to end against a real local CPU sandbox."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from learner.model import io as model_io
from learner.train import policy, sft
from learner.train import state as st
from learner.train.config import OptimConfig, SandboxConfig, TrainConfig, load_config
from learner.train.metrics import read_metrics
from learner.train.run_dir import open_run_dir
from learner.train.sft_data import load_sft_data

from .conftest import pair_record, write_jsonl
from .mesh_worker import tiny_batch


def tiny_config(run_dir: Path, pairs: Path, tokenizer_dir: Path, *extra: str) -> TrainConfig:
    return load_config(
        "tiny-cpu",
        [
            f"run_dir={run_dir}",
            f"data.pairs={pairs}",
            f"model.tokenizer={tokenizer_dir}",
            "data.seq_len=320",
            "data.batch_size=4",
            "data.heldout_fraction=0.1",
            "optim.total_steps=30",
            "optim.warmup_steps=3",
            "optim.lr=5e-3",
            "eval.every=15",
            "eval.pass_at_1_problems=0",
            "checkpoint.every=15",
            "log.every=3",
            "log.progress=false",
            "log.tensorboard=false",
            *extra,
        ],
    )


def test_sft_loss_goes_down_and_the_model_is_saved(
    tmp_path: Path, pairs_file: Path, tokenizer_dir: Path
) -> None:
    cfg = tiny_config(tmp_path / "run", pairs_file, tokenizer_dir)
    summary = sft.run_sft(cfg)
    assert summary["step"] == 30
    records = read_metrics(cfg.run_dir)
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    held = [r["eval/heldout_loss"] for r in records if "eval/heldout_loss" in r]
    assert len(losses) == 10 and len(held) == 2
    assert losses[-1] < 0.6 * losses[0], losses
    assert held[-1] < held[0]
    assert all(np.isfinite(losses))
    lrs = [r["train/lr"] for r in records if "train/lr" in r]
    assert max(lrs) <= 5e-3 + 1e-9 and lrs[-1] < max(lrs)  # warmed up, then decayed
    # The trained model is a model directory the sampler and the RL trainer can load.
    model, _ = model_io.load(Path(cfg.run_dir) / "model")
    assert model.config.num_layers == cfg.model.num_layers
    assert (Path(cfg.run_dir) / "model" / "tokenizer.json").is_file()


def test_packed_rows_predict_the_next_token_wherever_there_is_loss(
    pairs_file: Path, tokenizer_dir: Path
) -> None:
    """The loss scores log p(tokens[t+1]) at t: the data's targets must be exactly that."""
    data = load_sft_data(pairs_file, tokenizer_dir, seq_len=320)
    for row in data.train:
        mask = row["loss_mask"][:-1] > 0
        assert row["loss_mask"][-1] == 0
        assert np.array_equal(row["targets"][:-1][mask], row["tokens"][1:][mask])


def _one_step(cfg: TrainConfig, batch: dict[str, np.ndarray]) -> tuple[Any, dict[str, float]]:
    qcfg = policy.qwen2_config(cfg.model)
    mesh = st.mesh_for(cfg.mesh)
    state = st.create_train_state(cfg, qcfg, mesh)
    state, out = sft.SftSteps(state, mesh, cfg).train(state, batch)
    return st.host_params(state), {k: float(v) for k, v in jax.device_get(out).items()}


def test_accumulated_micro_batches_equal_one_big_batch() -> None:
    rows = tiny_batch(8, 40, 128, seed=3)
    common = ["model.vocab_size=128", "optim.warmup_steps=0", "optim.lr=1e-3"]
    big = load_config("tiny-cpu", [*common, "data.batch_size=8", "optim.grad_accum=1"])
    small = load_config("tiny-cpu", [*common, "data.batch_size=2", "optim.grad_accum=4"])
    params_big, out_big = _one_step(big, sft.as_micro_batches(rows, 1))
    params_small, out_small = _one_step(small, sft.as_micro_batches(rows, 4))
    assert out_small["loss_tokens"] == out_big["loss_tokens"] == rows["loss_mask"][:, :-1].sum()
    assert out_small["loss"] == pytest.approx(out_big["loss"], rel=1e-6)
    assert out_small["grad_norm"] == pytest.approx(out_big["grad_norm"], rel=1e-5)
    for key, value in params_big.items():
        np.testing.assert_allclose(params_small[key], value, atol=2e-6, err_msg=key)


def test_schedule_warms_up_then_decays_to_the_end_ratio() -> None:
    schedule = st.lr_schedule(OptimConfig(lr=1.0, warmup_steps=4, total_steps=20, end_lr_ratio=0.1))
    values = [float(schedule(k)) for k in range(25)]
    assert values[0] == pytest.approx(0.25) and values[4] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(values[:4], values[1:5], strict=True))
    assert all(a >= b for a, b in zip(values[4:20], values[5:21], strict=True))
    assert values[20] == pytest.approx(0.1) and values[24] == pytest.approx(0.1)


# -- held-out pass@1 through a real sandbox ----------------------------------------------------


def _cpu_sandbox_or_skip() -> SandboxConfig:
    from tests.sandbox.conftest import cpu_interpreter_problem

    problem = cpu_interpreter_problem()
    if problem:
        pytest.skip(problem)
    weak = os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1"
    return SandboxConfig(workers=2, device="cpu", trials=2, allow_weak_isolation=weak)


def test_pass_at_1_end_to_end_with_a_local_cpu_sandbox(tmp_path: Path, tokenizer_dir: Path) -> None:
    from learner.train.verify import pass_at_1, sandbox_client
    from synth.teacher.prompt import build_completion
    from tests.sandbox.conftest import GOOD_RELU, RELU_PROBLEM, WRONG_RELU

    sandbox = _cpu_sandbox_or_skip()
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [pair_record(i) for i in range(40)])
    cfg = tiny_config(
        tmp_path / "run",
        pairs,
        tokenizer_dir,
        "data.heldout_fraction=0.1",
        "eval.pass_at_1_problems=3",
        "eval.max_new_tokens=24",
        "eval.sample_batch=2",
    )
    with sandbox_client(sandbox) as client:
        # Known answers: one correct kernel, one wrong, one completion without a code block.
        judged = pass_at_1(
            client,
            [RELU_PROBLEM] * 3,
            [build_completion(GOOD_RELU), build_completion(WRONG_RELU), "no code"],
            trials=2,
        )
        assert (judged.total, judged.correct, judged.judged, judged.no_code) == (3, 1, 3, 1)
        assert judged.verdicts["wrong_output"] == 1 and judged.rate == pytest.approx(1 / 3)
        # The trainer's path: sample held-out problems with the policy, judge, count.
        trainer = sft.SftTrainer(cfg, open_run_dir(cfg, "sft"), client)
        try:
            trainer.setup(resumes=False)
            problems = min(3, len(trainer.data.held_out_prompts))
            assert problems >= 2
            figures = trainer.evaluate(step=1)
        finally:
            trainer.close()
    assert figures["pass_at_1_judged"] + figures["pass_at_1_sandbox_errors"] == problems
    assert figures["pass_at_1_sandbox_errors"] == 0
    assert 0.0 <= figures["pass_at_1"] <= 1.0 and np.isfinite(figures["heldout_loss"])
