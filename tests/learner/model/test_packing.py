"""Packed rows (several sequences per row, `segment_ids`) score each sequence as if alone."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from learner.model import logprobs, qwen2

from ..conftest import random_tiny_model

A = [5, 17, 99, 3, 42]
B = [7, 7, 120, 64, 1, 88]
PAD = 3


@pytest.fixture(scope="module")
def model() -> qwen2.Qwen2:
    return random_tiny_model(tied=False, seed=3)


def _alone(model: qwen2.Qwen2, seq: list[int]) -> np.ndarray:
    tokens = jnp.asarray([seq], jnp.int32)
    positions = jnp.arange(len(seq))[None]
    return np.asarray(model(tokens, positions)[0][0])


def _packed() -> tuple[jnp.ndarray, jnp.ndarray]:
    """Row 0: A, B, padding; row 1: B, A, padding (the same sequences, other offsets)."""
    rows = [A + B + [0] * PAD, B + A + [0] * PAD]
    segments = [[1] * len(A) + [2] * len(B) + [0] * PAD, [1] * len(B) + [2] * len(A) + [0] * PAD]
    return jnp.asarray(rows, jnp.int32), jnp.asarray(segments, jnp.int32)


def test_segment_positions_restart_per_segment() -> None:
    _, segments = _packed()
    got = np.asarray(qwen2.segment_positions(segments))
    np.testing.assert_array_equal(got[0], [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 0, 1, 2])
    np.testing.assert_array_equal(got[1], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 0, 1, 2])


def test_packed_row_gives_each_sequence_its_own_logits(model: qwen2.Qwen2) -> None:
    tokens, segments = _packed()
    positions = qwen2.segment_positions(segments)
    packed = np.asarray(model(tokens, positions, segment_ids=segments)[0])
    assert np.isfinite(packed).all()  # padding rows too
    a, b = _alone(model, A), _alone(model, B)
    np.testing.assert_allclose(packed[0, : len(A)], a, atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[0, len(A) : len(A) + len(B)], b, atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[1, : len(B)], b, atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[1, len(B) : len(A) + len(B)], a, atol=1e-5, rtol=0)
    # Without segment ids the second sequence would see the first: the test can fail.
    unpacked = np.asarray(model(tokens, positions)[0])
    assert np.abs(unpacked[0, len(A) : len(A) + len(B)] - b).max() > 1e-3


def test_packed_logprobs_match_each_sequence_alone(model: qwen2.Qwen2) -> None:
    tokens, segments = _packed()
    for chunk in (0, 4):
        packed = np.asarray(
            logprobs.next_token_logprobs(model, tokens, chunk=chunk, segment_ids=segments)
        )
        alone_a = np.asarray(logprobs.next_token_logprobs(model, jnp.asarray([A])))[0]
        alone_b = np.asarray(logprobs.next_token_logprobs(model, jnp.asarray([B])))[0]
        # entry t predicts token t + 1: within-segment entries only
        np.testing.assert_allclose(packed[0, : len(A) - 1], alone_a, atol=1e-5, rtol=0)
        np.testing.assert_allclose(
            packed[0, len(A) : len(A) + len(B) - 1], alone_b, atol=1e-5, rtol=0
        )


def test_packed_forward_refuses_what_it_cannot_serve(model: qwen2.Qwen2) -> None:
    tokens, segments = _packed()
    positions = qwen2.segment_positions(segments)
    with pytest.raises(ValueError, match="shape"):
        model(tokens, positions, segment_ids=segments[:, :-1])
    with pytest.raises(ValueError, match="not both"):
        model(tokens, positions, qwen2.causal_mask(2, tokens.shape[1]), segment_ids=segments)
    cache = qwen2.init_cache(model.config, 2, tokens.shape[1])
    with pytest.raises(ValueError, match="uncached"):
        model(tokens, positions, cache=cache, segment_ids=segments)
