"""The Flax Qwen2 matches transformers' torch Qwen2ForCausalLM on random weights."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.model import io as model_io
from learner.model import qwen2

LENGTH = 13


def _torch_reference(hf_dir: Path, tokens: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    import torch
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        out = model(torch.as_tensor(tokens), output_hidden_states=True)
    logprobs = torch.log_softmax(out.logits.float(), dim=-1).numpy()
    return logprobs, [h.numpy() for h in out.hidden_states]


@jax.jit
def _forward(
    state: nnx.State, graphdef: nnx.GraphDef, tokens: jax.Array
) -> tuple[jax.Array, list[jax.Array]]:
    """Log-probs plus what HF reports as hidden states: the embeddings, every layer's output
    but the last, and the final-norm output."""
    model = nnx.merge(graphdef, state)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    sin, cos = qwen2.rope_angles(positions, model.config.head_dim, model.config.rope_theta)
    x = model.embedder.encode(tokens)
    layers = [x]
    for layer in model.layers:
        x, _ = layer(x, sin, cos, None, None, None)
        layers.append(x)
    layers[-1] = model.final_norm(x)
    logits, _ = model(tokens, positions)
    return jax.nn.log_softmax(logits, axis=-1), layers


_forward = jax.jit(_forward.__wrapped__, static_argnums=1)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_logprobs_and_layers_match_transformers(tied: bool, request: pytest.FixtureRequest) -> None:
    hf_dir = request.getfixturevalue("hf_tied" if tied else "hf_untied")
    tokens = np.random.default_rng(0).integers(0, 128, size=(2, LENGTH))
    ref_logprobs, ref_layers = _torch_reference(hf_dir, tokens)

    model, _ = model_io.load_hf(hf_dir)
    assert (model.lm_head is None) == tied
    graphdef, state = nnx.split(model)
    logprobs, layers = _forward(state, graphdef, jnp.asarray(tokens))

    assert len(layers) == len(ref_layers) == model.config.num_layers + 1
    for i, (ours, ref) in enumerate(zip(layers, ref_layers, strict=True)):
        np.testing.assert_allclose(
            np.asarray(ours), ref, atol=2e-5, rtol=1e-5, err_msg=f"hidden state {i}"
        )
    np.testing.assert_allclose(np.asarray(logprobs), ref_logprobs, atol=1e-4, rtol=0)
    # The per-token scores a policy gradient uses, not only the full distributions.
    picked = np.take_along_axis(ref_logprobs[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    ours_picked = np.take_along_axis(np.asarray(logprobs)[:, :-1], tokens[:, 1:, None], axis=-1)[
        ..., 0
    ]
    np.testing.assert_allclose(ours_picked, picked, atol=1e-4, rtol=0)


def test_bfloat16_compute_stays_close_to_float32(hf_untied: Path) -> None:
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 128, size=(1, LENGTH)))
    full, _ = model_io.load_hf(hf_untied)
    half, _ = model_io.load_hf(hf_untied, param_dtype="bfloat16")
    assert half.embedder.embedding[...].dtype == jnp.bfloat16
    (g32, s32), (g16, s16) = nnx.split(full), nnx.split(half)
    ref, _ = _forward(s32, g32, tokens)
    low, _ = _forward(s16, g16, tokens)
    assert low.dtype == jnp.float32  # logits leave the model in float32 whatever the compute dtype
    probs = np.exp(np.asarray(ref))
    # Expected |difference| of log-probs under the reference distribution: small but not zero.
    gap = float(np.sum(probs * np.abs(np.asarray(low) - np.asarray(ref)), axis=-1).max())
    assert 0 < gap < 0.15
