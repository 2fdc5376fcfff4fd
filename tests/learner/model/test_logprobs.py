"""Chunked log-probabilities equal the plain ones, values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.model import logprobs

from ..conftest import random_tiny_model


def test_chunked_logprobs_and_gradients_equal_unchunked() -> None:
    model = random_tiny_model(tied=True, num_hidden_layers=1, hidden_size=32, intermediate_size=32)
    graphdef, state = nnx.split(model)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 128, size=(2, 12)))

    def loss(state: nnx.State, chunk: int) -> tuple[jax.Array, jax.Array]:
        lp = logprobs.next_token_logprobs(nnx.merge(graphdef, state), tokens, chunk=chunk)
        return -lp.mean(), lp

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (plain_loss, plain), plain_grad = grad(state, 0)
    (chunk_loss, chunked), chunk_grad = grad(
        state, 5
    )  # 11 targets: two full chunks and a ragged one
    assert plain.shape == (2, 11)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(plain), atol=1e-6)
    for a, b in zip(jax.tree.leaves(chunk_grad), jax.tree.leaves(plain_grad), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert float(plain_loss) > 0


def test_gather_logprobs_is_log_softmax() -> None:
    logits = jnp.asarray([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    got = logprobs.gather_logprobs(logits, jnp.asarray([2, 1]))
    want = jax.nn.log_softmax(logits)[jnp.arange(2), jnp.asarray([2, 1])]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
