"""Exact resume: an SFT run killed with SIGKILL and started again ends with the parameters
and optimizer state of a run that never stopped, bit for bit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from learner import tokenizer as tokenizers
from learner.train import policy
from learner.train import state as st
from learner.train.checkpoint import Checkpointer
from learner.train.config import load_config
from learner.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]
STEPS = 30
EVERY = 3
KILL_AFTER = 2 * EVERY  # kill once a checkpoint past the first one is on disk


def _overrides(run_dir: Path, pairs: Path, tokenizer_dir: Path) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"data.pairs={pairs}",
        f"model.tokenizer={tokenizer_dir}",
        "data.seq_len=320",
        "data.batch_size=2",
        "optim.grad_accum=2",
        f"optim.total_steps={STEPS}",
        "optim.warmup_steps=5",
        f"checkpoint.every={EVERY}",
        "checkpoint.keep=2",
        "eval.every=0",
        "eval.at_end=false",
        "eval.pass_at_1_problems=0",
        "log.every=1",
        "log.progress=false",
        "log.tensorboard=false",
    ]


def _start(overrides: list[str], cache: Path) -> subprocess.Popen[str]:
    """`drtriton train sft` in its own process; the three runs share XLA's compilation cache
    (the same program, compiled once: the resumed run's start-up is the cost saved)."""
    args = [sys.executable, "-m", "drtriton_cli", "train", "sft", "--config", "tiny-cpu"]
    for item in overrides:
        args += ["--set", item]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _saved_steps(run_dir: Path) -> list[int]:
    """Committed checkpoint steps (orbax renames a step directory into place when done)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())


def _final_state(overrides: list[str], run_dir: Path, tokenizer_dir: Path) -> dict:
    cfg = load_config("tiny-cpu", overrides)
    qcfg = policy.qwen2_config(cfg.model, len(tokenizers.load_tokenizer(tokenizer_dir)))
    abstract, _ = st.abstract_train_state(cfg, qcfg, st.mesh_for(cfg.mesh))
    with Checkpointer(run_dir / "checkpoints", keep=2, every=EVERY) as checkpointer:
        assert checkpointer.latest_step() == STEPS
        arrays, meta = checkpointer.restore(STEPS, abstract.arrays())
    return {"arrays": jax.device_get(arrays), "meta": meta}


def test_sigkilled_run_resumes_to_the_same_bits(
    tmp_path: Path, pairs_file: Path, tokenizer_dir: Path
) -> None:
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    cache = tmp_path / "xla-cache"
    straight = _start(_overrides(straight_dir, pairs_file, tokenizer_dir), cache)
    killed = _start(_overrides(killed_dir, pairs_file, tokenizer_dir), cache)
    try:
        deadline = time.monotonic() + 300
        while not any(s >= KILL_AFTER for s in _saved_steps(killed_dir)):
            assert killed.poll() is None, killed.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint in 300 s"
            time.sleep(0.01)
        killed.send_signal(signal.SIGKILL)
        killed.wait(60)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait(60)
    assert killed.returncode == -signal.SIGKILL
    stopped_at = max(_saved_steps(killed_dir))
    assert KILL_AFTER <= stopped_at < STEPS, "the run finished before it was killed"

    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err[-3000:]
    resumed = _start(_overrides(killed_dir, pairs_file, tokenizer_dir), cache)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]

    overrides = _overrides(straight_dir, pairs_file, tokenizer_dir)
    want = _final_state(overrides, straight_dir, tokenizer_dir)
    got = _final_state(overrides, killed_dir, tokenizer_dir)
    assert got["meta"]["data"] == want["meta"]["data"]  # same data position
    leaves_want = jax.tree_util.tree_flatten_with_path(want["arrays"])[0]
    leaves_got = jax.tree.leaves(got["arrays"])
    assert len(leaves_got) == len(leaves_want)
    for (path, a), b in zip(leaves_want, leaves_got, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b), jax.tree_util.keystr(path)
    # The metrics read as one run: every step once, and the same losses.
    losses = {r["step"]: r["train/loss"] for r in read_metrics(killed_dir) if "train/loss" in r}
    straight_losses = {
        r["step"]: r["train/loss"] for r in read_metrics(straight_dir) if "train/loss" in r
    }
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses == straight_losses
