"""Checkpointer: whole train states round-trip exactly; every/keep/force; partial saves."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from learner.train import policy
from learner.train import state as st
from learner.train.checkpoint import Checkpointer, CheckpointError
from learner.train.config import load_config


@pytest.fixture(scope="module")
def tiny_state() -> tuple[st.TrainState, st.TrainState]:
    cfg = load_config("tiny-cpu", ["model.vocab_size=128"])
    qcfg = policy.qwen2_config(cfg.model)
    mesh = st.mesh_for(cfg.mesh)
    state = st.create_train_state(cfg, qcfg, mesh)
    abstract, _ = st.abstract_train_state(cfg, qcfg, mesh)
    return state, abstract


def _leaves_equal(a: object, b: object) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(la, lb, strict=True)
    )


def test_train_state_round_trips_bit_for_bit(tmp_path: Path, tiny_state) -> None:
    state, abstract = tiny_state
    # A state that has moved: nonzero moments and step, so every leaf is checked.
    grads = jax.tree.map(lambda p: 0.01 * np.ones(p.shape, np.float32), state.params)
    moved, _ = st.apply_gradients(state, grads)
    meta = {"kind": "sft", "data": {"step": 5, "grain": {"nested": [1, 2]}}}
    with Checkpointer(tmp_path / "ck", keep=2, every=1) as checkpointer:
        assert checkpointer.save(1, moved.arrays(), meta)
        checkpointer.wait()
        arrays, meta_back = checkpointer.restore(None, abstract.arrays())
    assert meta_back == meta
    restored = abstract.with_arrays(arrays)
    assert jax.tree.structure(restored.arrays()) == jax.tree.structure(moved.arrays())
    assert _leaves_equal(restored.arrays(), moved.arrays())
    assert int(restored.step) == 1


def test_every_keep_and_force(tmp_path: Path) -> None:
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int32(0)}
    with Checkpointer(tmp_path, keep=2, every=3) as checkpointer:
        saved = [s for s in range(1, 8) if checkpointer.save(s, state, {"s": s})]
        assert saved == [3, 6]
        assert checkpointer.save(7, state, {"s": 7}, force=True)
        assert not checkpointer.save(7, state, {"s": 7}, force=True)  # already there
        checkpointer.wait()
        assert checkpointer.all_steps() == [6, 7]  # the newest `keep`
        assert checkpointer.latest_step() == 7
        assert checkpointer.read_meta() == {"s": 7}
        assert checkpointer.read_meta(6) == {"s": 6}
        with pytest.raises(CheckpointError, match="step 3"):
            checkpointer.restore(3, state)


def test_a_partial_step_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    state = {"w": np.ones(4, np.float32)}
    with Checkpointer(tmp_path, keep=3, every=1) as checkpointer:
        checkpointer.save(1, state, {"s": 1})
    # What a kill in the middle of a save leaves: a step directory that was never committed.
    shutil.copytree(tmp_path / "1", tmp_path / "2.orbax-checkpoint-tmp-123")
    with Checkpointer(tmp_path, keep=3, every=1) as checkpointer:
        assert checkpointer.latest_step() == 1
        arrays, meta = checkpointer.restore(None, state)
    assert meta == {"s": 1} and np.array_equal(arrays["w"], state["w"])


def test_restore_without_checkpoints_is_a_clear_error(tmp_path: Path) -> None:
    with Checkpointer(tmp_path, keep=1, every=1) as checkpointer:
        assert checkpointer.latest_step() is None
        with pytest.raises(CheckpointError, match="no checkpoint"):
            checkpointer.restore(None, {"w": np.ones(2)})
