"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 by test_sharding.py.

XLA reads its flags once, when jax starts, so the 8-device mesh needs its own process. Prints
one JSON object of measurements; the test asserts on them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import learner.sharding as sharding
from learner.generate import decode, sampler
from learner.model import io as model_io


def _logits(model, tokens: np.ndarray, mesh=None) -> np.ndarray:
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(graphdef, state)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return m(tokens, positions)[0]

    if mesh is None:
        return np.asarray(run(state, tokens))
    with jax.set_mesh(mesh):
        out = run(state, jax.device_put(tokens, sharding.batch_sharding(mesh, tokens.shape)))
    return np.asarray(out)


def _fuse(graphdef: nnx.GraphDef, state: nnx.State) -> decode.DecodeWeights:
    return decode.fuse_decode_weights(nnx.merge(graphdef, state))


def main(model_dir: str, hf_dir: str) -> None:
    report: dict[str, object] = {"devices": jax.device_count()}
    tokens = np.random.default_rng(0).integers(0, 128, size=(8, 12)).astype(np.int32)
    single, _ = model_io.load(Path(model_dir))
    reference = _logits(single, tokens)
    prompts = [
        [3, 1, 4, 1, 5],
        [9],
        [2, 6, 5],
        [3, 5, 8, 9, 7, 9, 3],
        [2],
        [3, 8],
        [4, 6, 2, 6],
        [4, 3],
    ]
    params = sampler.SamplingParams(max_new_tokens=6, temperature=0.0)
    expected = [
        c.tokens for c in sampler.Sampler(single, prompt_bucket=8).generate(prompts, params)
    ]

    for fsdp, tp in ((4, 2), (2, 4)):
        mesh = sharding.make_mesh(fsdp, tp)
        model, _ = model_io.load(Path(model_dir), mesh=mesh)
        graphdef, state = nnx.split(model)
        key = f"{fsdp}x{tp}"
        report[f"logits_diff_{key}"] = float(np.abs(_logits(model, tokens, mesh) - reference).max())
        report[f"q_spec_{key}"] = str(model.layers[0].attn.q_proj.kernel[...].sharding.spec)
        report[f"k_spec_{key}"] = str(model.layers[0].attn.k_proj.kernel[...].sharding.spec)
        report[f"q_shards_{key}"] = len(
            {str(s.index) for s in model.layers[0].attn.q_proj.kernel[...].addressable_shards}
        )
        with jax.set_mesh(mesh):
            fused = jax.jit(_fuse, static_argnums=0)(graphdef, state)
        report[f"qkv_spec_{key}"] = str(fused.layers[0].qkv.sharding.spec)
        report[f"gate_up_spec_{key}"] = str(fused.layers[0].gate_up.sharding.spec)
        # the fused decode weights split KV heads over tp where it divides them (4x2), else not
        got = sampler.Sampler(model, prompt_bucket=8, mesh=mesh).generate(prompts, params)
        report[f"sample_equal_{key}"] = [c.tokens for c in got] == expected
        if (fsdp, tp) == (4, 2):
            from_hf, _ = model_io.load(Path(hf_dir), mesh=mesh)
            report["hf_load_diff"] = max(
                float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
                for a, b in zip(
                    model_io.flat_params(from_hf).values(),
                    model_io.flat_params(model).values(),
                    strict=True,
                )
            )
            report["hf_embed_spec"] = str(from_hf.embedder.embedding[...].sharding.spec)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
