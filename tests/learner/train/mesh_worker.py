"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 by the train tests.

XLA reads its flags once, when jax starts, so an 8-device mesh needs its own process.
`python -m tests.learner.train.mesh_worker MODE` prints one JSON object; modes:

- `sharded-step`: one SFT step of a tiny model on an fsdp x tp = 4 x 2 mesh and on one
  device, from the same parameters and batch; reports the largest differences.
- `abstract-7b`: the 7b-cluster preset's train state and step, shapes and shardings only
  (jax.eval_shape), on a 2 x 4 mesh.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from learner.sharding import make_mesh
from learner.train import policy, sft
from learner.train import state as st
from learner.train.config import load_config
from learner.train.packing import ROW_KEYS, pack_row


def tiny_batch(rows: int, seq_len: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Packed rows of random sequences (prompt then completion), 2-3 per row."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        seqs = [rng.integers(1, vocab, size=rng.integers(6, 14)).astype(np.int32) for _ in range(3)]
        prompts = [int(rng.integers(2, 5)) for _ in seqs]
        out.append(pack_row(seqs, prompts, seq_len, 0))
    return {key: np.stack([row[key] for row in out]) for key in ROW_KEYS}


def _one_step(cfg, qcfg, mesh, batch):
    state = st.create_train_state(cfg, qcfg, mesh)
    steps = sft.SftSteps(state, mesh, cfg)
    state, out = steps.train(state, batch)
    return st.host_params(state), {k: float(v) for k, v in jax.device_get(out).items()}


def sharded_step() -> dict[str, object]:
    cfg = load_config(
        "tiny-cpu",
        [
            "model.vocab_size=256",
            "optim.grad_accum=2",
            "data.batch_size=8",
            "optim.lr=1e-3",
            "optim.warmup_steps=0",
        ],
    )
    qcfg = policy.qwen2_config(cfg.model)
    batch = sft.as_micro_batches(tiny_batch(16, 48, 256), cfg.optim.grad_accum)
    single = make_mesh(1, 1, devices=jax.devices()[:1])
    sharded = make_mesh(4, 2)
    ref_params, ref_out = _one_step(cfg, qcfg, single, batch)
    params, out = _one_step(cfg, qcfg, sharded, batch)
    state = st.create_train_state(cfg, qcfg, sharded)
    q = state.params["layers"][0]["attn"]["q_proj"]["kernel"]
    return {
        "devices": jax.device_count(),
        "loss": out["loss"],
        "ref_loss": ref_out["loss"],
        "grad_norm": out["grad_norm"],
        "ref_grad_norm": ref_out["grad_norm"],
        "max_param_diff": max(float(np.max(np.abs(params[k] - ref_params[k]))) for k in params),
        "max_update": max(
            float(np.max(np.abs(params[k] - v))) for k, v in _initial(cfg, qcfg).items()
        ),
        "q_spec": str(q.sharding.spec),
        "q_shards": len({s.device for s in q.addressable_shards}),
    }


def _initial(cfg, qcfg) -> dict[str, np.ndarray]:
    state = st.create_train_state(cfg, qcfg, make_mesh(1, 1, devices=jax.devices()[:1]))
    return st.host_params(state)


def abstract_7b() -> dict[str, object]:
    cfg = load_config("7b-cluster", ["model.path="])
    qcfg = policy.qwen2_config(cfg.model)
    mesh = st.mesh_for(cfg.mesh)
    abstract, shardings = st.abstract_train_state(cfg, qcfg, mesh)
    flat = {
        st._param_path(path): x
        for path, x in jax.tree_util.tree_flatten_with_path(abstract.params)[0]
    }
    report: dict[str, object] = {
        "mesh": dict(mesh.shape),
        "params": int(sum(np.prod(x.shape) for x in flat.values())),
        "shapes": {
            k: list(v.shape)
            for k, v in flat.items()
            if not k.startswith("layers.") or k.startswith("layers.0.")
        },
        "specs": {k: str(v.sharding.spec) for k, v in flat.items()},
    }
    per_device = 0
    for x in jax.tree.leaves(abstract.arrays()):
        shard = x.sharding.shard_shape(x.shape)
        per_device += int(np.prod(shard)) * np.dtype(x.dtype).itemsize
    report["state_bytes_per_device"] = per_device
    report["state_bytes_total"] = sum(
        int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
        for x in jax.tree.leaves(abstract.arrays())
    )
    mu = abstract.opt_state[1][0].mu  # clip, then adamw's scale_by_adam state
    report["mu_q_spec"] = str(mu["layers"][0]["attn"]["q_proj"]["kernel"].sharding.spec)
    accum, rows, length = cfg.optim.grad_accum, cfg.data.batch_size, cfg.data.seq_len
    batch = {
        key: jax.ShapeDtypeStruct(
            (accum, rows, length), np.float32 if key == "loss_mask" else np.int32
        )
        for key in ROW_KEYS
    }
    step = jax.jit(
        lambda s, b: sft.sft_step(
            s, b, chunk=cfg.model.logits_chunk, schedule=st.lr_schedule(cfg.optim)
        )
    )
    with jax.set_mesh(mesh):
        new_state, out = jax.eval_shape(step, abstract, batch)
    report["step_out"] = sorted(out)
    report["step_keeps_structure"] = jax.tree.structure(new_state) == jax.tree.structure(abstract)
    return report


if __name__ == "__main__":
    mode = sys.argv[1]
    result = {"sharded-step": sharded_step, "abstract-7b": abstract_7b}[mode]()
    print(json.dumps(result))
