"""The fused decode path (QKV and gate-up regrouped once per decode) equals the module path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.generate import decode
from learner.generate import sampler as S
from learner.model import qwen2

from ..conftest import random_tiny_model

PROMPTS = [[5, 17, 99, 3, 64, 12, 7], [42], [8, 9, 10, 11]]
NEW = 9  # not a multiple of the chunk: the last chunk runs past max_new


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def model(request: pytest.FixtureRequest) -> qwen2.Qwen2:
    return random_tiny_model(tied=request.param, seed=3)


def _step_both(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    tokens: jax.Array,
    positions: jax.Array,
    mask: jax.Array,
    cache: qwen2.Cache,
    index: jax.Array,
) -> tuple[tuple[jax.Array, qwen2.Cache], tuple[jax.Array, qwen2.Cache]]:
    model = nnx.merge(graphdef, state)
    module = model(tokens, positions, mask, cache, index)
    fused = decode.fused_decode(
        model.config, decode.fuse_decode_weights(model), tokens, positions, mask, cache, index
    )
    return module, fused


_step_both = jax.jit(_step_both, static_argnums=0)


@pytest.mark.parametrize("new_tokens", [1, 3])
def test_fused_step_equals_module_step(model: qwen2.Qwen2, new_tokens: int) -> None:
    """One decode call on a random cache, one token or several: same logits, same cache."""
    cfg = model.config
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(new_tokens)
    batch, length, index = 2, 16, 6
    shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    cache = tuple(
        qwen2.LayerCache(
            jnp.asarray(rng.standard_normal(shape), jnp.float32),
            jnp.asarray(rng.standard_normal(shape), jnp.float32),
        )
        for _ in range(cfg.num_layers)
    )
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, new_tokens)), jnp.int32)
    positions = jnp.asarray(
        [[index + t for t in range(new_tokens)], [2 + t for t in range(new_tokens)]]
    )
    slots = jnp.arange(length)
    # row 0 sees slots 0..index+t; row 1 (left-padded) only slots 4..index+t
    upto = slots[None, None, :] <= index + jnp.arange(new_tokens)[None, :, None]
    mask = upto & (slots[None, None, :] >= jnp.asarray([0, 4])[:, None, None])
    (ref_logits, ref_cache), (logits, new_cache) = _step_both(
        graphdef, state, tokens, positions, mask, cache, jnp.int32(index)
    )
    assert logits.shape == (batch, new_tokens, cfg.vocab_size) and logits.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=2e-5, rtol=1e-5)
    for ours, theirs in zip(jax.tree.leaves(new_cache), jax.tree.leaves(ref_cache), strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=2e-5, rtol=1e-5)


def _greedy(model: qwen2.Qwen2, fused: bool) -> tuple[np.ndarray, ...]:
    graphdef, state = nnx.split(model)
    tokens, starts = S.left_pad(PROMPTS, 8)
    batch = len(PROMPTS)
    cache, logits = S.prefill(
        graphdef,
        state,
        tokens,
        starts,
        cache_len=tokens.shape[1] + S.decode_steps(NEW, 4),
        cache_dtype=jnp.float32,
    )
    out, _ = S.decode(
        graphdef,
        state,
        cache,
        logits,
        starts,
        np.arange(batch, dtype=np.uint32),
        np.full((batch, 0, 1), -1, np.int32),
        np.zeros((0,), np.int32),
        np.uint32(0),
        max_new=NEW,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        pad_id=0,
        chunk=4,
        fused=fused,
    )
    return tuple(np.asarray(x) for x in out)


def test_fused_decode_loop_gives_the_module_tokens_and_logprobs(model: qwen2.Qwen2) -> None:
    """The whole sampler loop, greedy fp32: identical tokens, log-probs to rounding."""
    tokens, logprobs, lengths, reasons = _greedy(model, fused=True)
    ref_tokens, ref_logprobs, ref_lengths, ref_reasons = _greedy(model, fused=False)
    assert (lengths == NEW).all() and (ref_lengths == NEW).all()
    assert len({tuple(row) for row in tokens.tolist()}) == len(PROMPTS)  # not degenerate
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_array_equal(reasons, ref_reasons)
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-5)


def test_sampler_can_decode_through_the_modules(model: qwen2.Qwen2) -> None:
    """`Sampler(fused_decode=False)` (no second copy of the weights) samples the same tokens."""
    params = S.SamplingParams(max_new_tokens=NEW, temperature=0.0)
    fused = S.Sampler(model).generate(PROMPTS, params)
    plain = S.Sampler(model, fused_decode=False).generate(PROMPTS, params)
    assert [c.tokens for c in fused] == [c.tokens for c in plain]
    np.testing.assert_allclose([c.logprobs for c in fused], [c.logprobs for c in plain], atol=1e-5)


@pytest.mark.parametrize("width", [50, 4099], ids=["short", "long-rows"])
def test_logit_stats_are_argmax_and_logsumexp(width: int) -> None:
    """One reduction gives what `jnp.argmax` and `jax.nn.logsumexp` give: the first of tied
    maxima, -inf entries ignored, and a row of only -inf at -inf."""
    logits = jax.random.normal(jax.random.key(width), (4, width)) * 4
    logits = logits.at[1, 7].set(30.0).at[1, width - 3].set(30.0)  # a tie: the first wins
    logits = logits.at[2, ::2].set(-jnp.inf)
    logits = logits.at[3].set(-jnp.inf)
    top, best, lse = S.logit_stats(logits)
    np.testing.assert_array_equal(best, jnp.argmax(logits, axis=-1))
    assert int(best[1]) == 7
    np.testing.assert_array_equal(top, jnp.max(logits, axis=-1))
    want = jax.nn.logsumexp(logits, axis=-1)
    assert float(lse[3]) == -np.inf and float(want[3]) == -np.inf
    np.testing.assert_allclose(lse[:3], want[:3], rtol=1e-6)


def test_rope_table_rows_are_the_angles_sin_and_cos() -> None:
    """The decode loop looks RoPE up in a table: the same values as computing them."""
    positions = jnp.asarray([[0, 5, 9], [17, 600, 1023]])
    sin, cos = qwen2.rope_angles(positions, 64, 1_000_000.0)
    table = qwen2.rope_table(1024, 64, 1_000_000.0)
    np.testing.assert_array_equal(jnp.take(table[0], positions, axis=0), sin)
    np.testing.assert_array_equal(jnp.take(table[1], positions, axis=0), cos)
