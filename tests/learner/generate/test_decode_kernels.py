"""The Pallas decode kernels (interpreted on CPU) against plain jnp, and the decode paths they
serve against the XLA ones."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from learner.generate import decode
from learner.generate import decode_kernels as dk
from learner.generate import sampler as S
from learner.model import qwen2

from ..conftest import random_tiny_model

EPS = 1e-6


def _normal(rng: np.random.Generator, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _close(got: jax.Array, want: jax.Array, tol: float) -> None:
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol
    )


# Shapes that no block divides (37 outputs, 100 inputs), forced small blocks (so the loop over
# the contracted dimension runs several steps with a ragged last one), and several token rows.
# Split: 7 chunks of 16 in 3 splits of 3 (the last split's two chunks past k read nothing), and
# 4 splits with the block picked from k / splits.
@pytest.mark.parametrize(
    "rows, block_n, block_k, splits",
    [(1, None, None, 1), (3, 8, 32, 1), (2, 4, 64, 1), (2, 8, 16, 3), (1, None, None, 4)],
    ids=str,
)
def test_matvec_residual(rows: int, block_n: int | None, block_k: int | None, splits: int) -> None:
    rng = np.random.default_rng(rows)
    x, w, res = _normal(rng, (rows, 100)), _normal(rng, (37, 100)), _normal(rng, (rows, 37))
    got = dk.matvec_residual(x, w, res, block_n=block_n, block_k=block_k, splits=splits)
    assert got.shape == (rows, 37) and got.dtype == jnp.float32
    _close(got, res + x @ w.T, 1e-5)


def test_matvec_residual_rejects_no_splits() -> None:
    x = jnp.zeros((1, 8))
    with pytest.raises(ValueError, match="splits=0"):
        dk.matvec_residual(x, jnp.zeros((4, 8)), jnp.zeros((1, 4)), splits=0)


def test_matvec_residual_bf16_rounds_like_xla() -> None:
    rng = np.random.default_rng(7)
    bf16 = jnp.bfloat16
    x, w, res = (
        _normal(rng, (2, 96), bf16),
        _normal(rng, (50, 96), bf16),
        _normal(rng, (2, 50), bf16),
    )
    want = res + jnp.einsum("rk,nk->rn", x, w, preferred_element_type=jnp.float32).astype(bf16)
    for splits in (1, 2):
        got = dk.matvec_residual(x, w, res, block_k=32, splits=splits)
        assert got.dtype == bf16
        _close(got, want, 3e-2)


def test_pieces_cover_a_row_exactly_in_powers_of_two() -> None:
    assert dk._pieces(4864) == [(0, 4096), (4096, 512), (4608, 256)]
    assert dk._pieces(896) == [(0, 512), (512, 256), (768, 128)]
    assert dk._pieces(1024) == [(0, 1024)]
    assert dk._pieces(100) == [(0, 64), (64, 32), (96, 16)]  # the last span overhangs, masked


def test_pieces_give_the_chunked_products() -> None:
    """Each row-contracting kernel with `pieces=True` (rows of 100 and 72: ragged spans)."""
    rng = np.random.default_rng(21)
    x, w, res = _normal(rng, (2, 100)), _normal(rng, (37, 100)), _normal(rng, (2, 37))
    _close(dk.matvec_residual(x, w, res, pieces=True), res + x @ w.T, 1e-5)
    x, w = _normal(rng, (3, 72)), 0.2 * _normal(rng, (2, 45, 72))
    _close(dk.gate_up_silu(x, w, eps=EPS, pieces=True), dk.gate_up_silu(x, w, eps=EPS), 1e-6)
    x, w, bias = _normal(rng, (1, 40)), 0.3 * _normal(rng, (2, 4, 16, 40)), _normal(rng, (2, 4, 16))
    args = (x, w, bias, jnp.asarray([3]), qwen2.rope_frequencies(16, 10000.0))
    _close(dk.qkv_rope(*args, eps=EPS, pieces=True), dk.qkv_rope(*args, eps=EPS), 1e-6)
    with pytest.raises(ValueError, match="no splits"):
        dk.matvec_residual(x, w.reshape(-1, 40), jnp.zeros((1, 128)), pieces=True, splits=2)


@pytest.mark.parametrize("rows, block_n, block_k", [(1, None, None), (3, 8, 16)], ids=str)
def test_gate_up_silu(rows: int, block_n: int | None, block_k: int | None) -> None:
    rng = np.random.default_rng(10 + rows)
    x, w = _normal(rng, (rows, 72)), 0.2 * _normal(rng, (2, 45, 72))
    got = dk.gate_up_silu(x, w, eps=EPS, block_n=block_n, block_k=block_k)
    gate_up = jnp.einsum("rk,cnk->rcn", x, w) * qwen2.inverse_rms(x, EPS)[:, :, None]
    _close(got, jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1], 1e-5)


def _qkv_reference(x, w, bias, sin, cos):
    """`decode._fused_layer`'s projection and rotation for one token per row."""
    rows = x.shape[0]
    kv, slots, d, _ = w.shape
    y = jnp.einsum("rm,kjdm->rkjd", x, w) * qwen2.inverse_rms(x, EPS)[:, :, None, None] + bias
    qk = y[:, :, : slots - 1].reshape(rows, 1, kv * (slots - 1), d)
    qk = qwen2.apply_rope(qk, sin[:, None], cos[:, None]).reshape(rows, kv, slots - 1, d)
    return jnp.concatenate([qk, y[:, :, slots - 1 :]], axis=2)


@pytest.mark.parametrize(
    "rows, kv, group, head_dim, block_j, block_k",
    [(1, 2, 2, 16, None, None), (3, 2, 3, 12, 4, 32), (2, 1, 1, 8, None, 16)],
    ids=str,
)
def test_qkv_rope(rows, kv, group, head_dim, block_j, block_k) -> None:
    rng = np.random.default_rng(head_dim)
    hidden = 40
    x = _normal(rng, (rows, hidden))
    w = 0.3 * _normal(rng, (kv, group + 2, head_dim, hidden))
    bias = _normal(rng, (kv, group + 2, head_dim))
    positions = jnp.asarray(rng.integers(0, 300, rows))
    inv_freq = qwen2.rope_frequencies(head_dim, 10000.0)
    got = dk.qkv_rope(x, w, bias, positions, inv_freq, eps=EPS, block_j=block_j, block_k=block_k)
    assert got.shape == (rows, kv, group + 2, head_dim)
    sin, cos = qwen2.rope_angles(positions, head_dim, 10000.0)
    _close(got, _qkv_reference(x, w, bias, sin, cos), 1e-5)


def test_qkv_rope_makes_the_models_angles_at_each_rows_position() -> None:
    """The kernel's own sine and cosine of position * inv_freq are the model's: its output is
    the rotation by the rows of `rope_table` (a late position like 31,000 included, where
    the float32 angle is largest), and moves with the position for queries and keys only."""
    rng = np.random.default_rng(3)
    rows, kv, group, head_dim, hidden = 3, 2, 2, 16, 40
    x = _normal(rng, (rows, hidden))
    w = 0.3 * _normal(rng, (kv, group + 2, head_dim, hidden))
    bias = _normal(rng, (kv, group + 2, head_dim))
    positions = jnp.asarray([5, 0, 31_000])
    inv_freq = qwen2.rope_frequencies(head_dim, 1_000_000.0)
    got = dk.qkv_rope(x, w, bias, positions, inv_freq, eps=EPS)
    sin, cos = (t[positions] for t in qwen2.rope_table(32_768, head_dim, 1_000_000.0))
    _close(got, _qkv_reference(x, w, bias, sin, cos), 1e-5)
    shifted = dk.qkv_rope(x, w, bias, positions + 1, inv_freq, eps=EPS)
    assert not np.allclose(got[2, :, :-1], shifted[2, :, :-1])  # queries and keys move
    np.testing.assert_array_equal(got[:, :, -1], shifted[:, :, -1])  # values do not


@pytest.mark.parametrize(
    "rows, kv, group, head_dim, length, block_s, splits",
    [
        (1, 2, 2, 16, 16, None, None),  # one program per KV head, no combine
        (3, 2, 3, 12, 40, 16, 2),  # ragged cache, split in two, head_dim and group padded
        (2, 1, 4, 16, 64, 16, 3),  # three splits over four chunks: the last split is short
    ],
    ids=str,
)
def test_attention_equals_cached_attention(rows, kv, group, head_dim, length, block_s, splits):
    rng = np.random.default_rng(length)
    qkv = _normal(rng, (rows, kv, group + 2, head_dim))
    cache_k, cache_v = (_normal(rng, (rows, kv, length, head_dim)) for _ in range(2))
    index = length // 2 + 1
    starts = jnp.asarray(rng.integers(0, index, rows))  # left padding: slots before are masked
    slots = jnp.arange(length)
    mask = (slots[None, :] >= starts[:, None]) & (slots[None, :] <= index)
    got, new_k, new_v = dk.attention(
        qkv, mask, cache_k, cache_v, jnp.int32(index), block_s=block_s, splits=splits
    )
    q = qkv[:, :, :group].reshape(rows, 1, kv * group, head_dim)
    want, cache = qwen2.cached_attention(
        q,
        qkv[:, None, :, group],
        qkv[:, None, :, group + 1],
        mask[:, None, :],
        qwen2.LayerCache(cache_k, cache_v),
        index,
    )
    _close(got, want.reshape(rows, -1), 1e-5)
    np.testing.assert_array_equal(np.asarray(new_k), np.asarray(cache.k))
    np.testing.assert_array_equal(np.asarray(new_v), np.asarray(cache.v))


@pytest.mark.parametrize("splits", [1, 3])
def test_attention_from_starts_equals_its_mask(splits: int) -> None:
    """Each row's start (and the new token's slot) make the mask the kernel would be given."""
    rows, kv, group, head_dim, length, index = 3, 2, 3, 16, 64, 37
    rng = np.random.default_rng(splits)
    qkv = _normal(rng, (rows, kv, group + 2, head_dim))
    cache_k, cache_v = (_normal(rng, (rows, kv, length, head_dim)) for _ in range(2))
    starts = jnp.asarray([0, 9, 36])
    slots = jnp.arange(length)
    mask = (slots[None, :] >= starts[:, None]) & (slots[None, :] <= index)
    options = {"block_s": 16, "splits": splits}
    got = dk.attention(qkv, None, cache_k, cache_v, index, starts=starts, **options)
    want = dk.attention(qkv, mask, cache_k, cache_v, index, **options)
    for ours, theirs in zip(got, want, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    unmasked = dk.attention(qkv, jnp.ones_like(mask), cache_k, cache_v, index, **options)
    assert not np.allclose(got[0], unmasked[0])  # the starts did mask something


def test_attention_takes_a_mask_or_starts() -> None:
    qkv = jnp.zeros((1, 1, 3, 16))
    cache = jnp.zeros((1, 1, 16, 16))
    for mask, starts in ((None, None), (jnp.ones((1, 16), bool), jnp.zeros(1, jnp.int32))):
        with pytest.raises(ValueError, match="exactly one"):
            dk.attention(qkv, mask, cache, cache, 0, starts=starts)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_equals_qwen2s(dtype: str) -> None:
    rng = np.random.default_rng(11)
    x = _normal(rng, (3, 40), dtype) * 3
    scale = 1 + 0.1 * _normal(rng, (40,), dtype)
    got = dk.rms_norm(x, scale, eps=EPS)
    assert got.dtype == x.dtype
    _close(got, qwen2.rms_norm(x, scale, EPS), 1e-6 if dtype == "float32" else 1e-2)


@pytest.mark.parametrize("splits", [1, 3])
def test_attention_never_reads_the_chunks_after_the_new_tokens(splits: int) -> None:
    """Chunks wholly in the future hold NaN here: a looping program that read one gives NaN."""
    rows, kv, group, head_dim, length, index = 2, 2, 3, 16, 64, 21
    rng = np.random.default_rng(splits)
    qkv = _normal(rng, (rows, kv, group + 2, head_dim))
    cache_k, cache_v = (_normal(rng, (rows, kv, length, head_dim)) for _ in range(2))
    slots = jnp.arange(length)
    mask = jnp.broadcast_to(slots <= index, (rows, length))
    block_s = 16
    future = (slots >= (index // block_s + 1) * block_s)[None, None, :, None]
    got, _, _ = dk.attention(
        qkv,
        mask,
        jnp.where(future, jnp.nan, cache_k),
        jnp.where(future, jnp.nan, cache_v),
        jnp.int32(index),
        block_s=block_s,
        splits=splits,
    )
    want, _, _ = dk.attention(
        qkv, mask, jnp.where(future, 0.0, cache_k), jnp.where(future, 0.0, cache_v), index
    )
    assert bool(jnp.all(jnp.isfinite(got)))
    _close(got, want, 1e-6)


# --------------------------------------------------------------------------------------------
# The decode paths
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> qwen2.Qwen2:
    return random_tiny_model(tied=True, seed=5)


@pytest.fixture(scope="module")
def model_bf16() -> qwen2.Qwen2:
    return random_tiny_model(tied=True, seed=5, dtype="bfloat16")


def _step(graphdef, state, tokens, positions, mask, cache, index, kernels, rope=None, starts=None):
    model = nnx.merge(graphdef, state)
    weights = decode.fuse_decode_weights(model)
    return decode.fused_decode(
        model.config, weights, tokens, positions, mask, cache, index, kernels, rope, starts
    )


_step = jax.jit(_step, static_argnums=(0, 7))


@pytest.mark.parametrize(
    "new_tokens, dtype, tol",
    [(1, "float32", 2e-4), (2, "float32", 2e-4), (1, "bfloat16", 0.1)],
    ids=["pallas", "two-tokens-fall-back-to-xla", "pallas-bf16"],
)
def test_fused_decode_pallas_equals_xla(
    request: pytest.FixtureRequest, new_tokens: int, dtype: str, tol: float
) -> None:
    """One decode call on a random cache with left-padded rows: the logits and both caches of
    the Pallas layers are the XLA layers' (to float32 rounding; bf16 rounds in other places)."""
    model = request.getfixturevalue("model" if dtype == "float32" else "model_bf16")
    cfg = model.config
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(new_tokens)
    batch, length, index = 3, 24, 9
    shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    cache = tuple(
        qwen2.LayerCache(
            _normal(rng, shape, cfg.compute_dtype), _normal(rng, shape, cfg.compute_dtype)
        )
        for _ in range(cfg.num_layers)
    )
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, new_tokens)), jnp.int32)
    starts = jnp.asarray([0, 3, 5])
    positions = index - starts[:, None] + jnp.arange(new_tokens)[None, :]
    slots = jnp.arange(length)
    upto = slots[None, None, :] <= index + jnp.arange(new_tokens)[None, :, None]
    mask = upto & (slots[None, None, :] >= starts[:, None, None])
    args = (graphdef, state, tokens, positions, mask, cache, jnp.int32(index))
    ref_logits, ref_cache = _step(*args, "xla")
    # As the decode loop calls it too: the RoPE table and the rows' starts instead of the mask.
    loop_args = (qwen2.rope_table(length, cfg.head_dim, cfg.rope_theta), starts)
    for extra in ((), loop_args):
        logits, new_cache = _step(*args, "pallas", *extra)
        assert logits.shape == (batch, new_tokens, cfg.vocab_size)
        assert logits.dtype == jnp.float32
        _close(logits, ref_logits, tol)
        leaves = zip(jax.tree.leaves(new_cache), jax.tree.leaves(ref_cache), strict=True)
        for ours, theirs in leaves:
            assert ours.dtype == theirs.dtype
            _close(ours, theirs, tol / 2)


def test_sampler_pallas_greedy_tokens_equal_xla(model: qwen2.Qwen2) -> None:
    prompts = [[5, 17, 99, 3, 64, 12, 7], [42], [8, 9, 10, 11]]
    params = S.SamplingParams(max_new_tokens=6, temperature=0.0)
    xla = S.Sampler(model, prompt_bucket=8, chunk=4, decode_kernels="xla").generate(prompts, params)
    pallas = S.Sampler(model, prompt_bucket=8, chunk=4, decode_kernels="pallas").generate(
        prompts, params
    )
    assert [c.tokens for c in pallas] == [c.tokens for c in xla]
    assert len({tuple(c.tokens) for c in xla}) == len(prompts)  # not degenerate
    np.testing.assert_allclose([c.logprobs for c in pallas], [c.logprobs for c in xla], atol=1e-4)


@pytest.mark.parametrize(
    "kernels, batch, time, backend, want",
    [
        ("auto", 1, 1, "gpu", True),
        ("auto", decode.AUTO_PALLAS_ROWS, 1, "gpu", True),
        ("auto", decode.AUTO_PALLAS_ROWS + 1, 1, "gpu", False),  # measured slower there
        ("auto", 1, 1, "cpu", False),  # would run interpreted
        ("pallas", 1, 1, "cpu", True),  # asked for: interpreted
        ("pallas", dk.MAX_ROWS, 1, "gpu", True),
        ("pallas", dk.MAX_ROWS + 1, 1, "gpu", False),
        ("pallas", 1, 2, "gpu", False),  # the prompt, not a decode step
        ("xla", 1, 1, "gpu", False),
    ],
    ids=str,
)
def test_uses_pallas(kernels: str, batch: int, time: int, backend: str, want: bool) -> None:
    assert decode.uses_pallas(kernels, batch, time, backend) is want


def test_default_sampler_decodes_with_pallas_on_a_gpu_only(model: qwen2.Qwen2) -> None:
    """ "auto", the default, keeps the interpreter out of decoding off the GPU."""
    sampler = S.Sampler(model, prompt_bucket=8, chunk=4)
    assert sampler.decode_kernels == "auto"
    on_gpu = jax.default_backend() == "gpu"
    assert decode.uses_pallas(sampler.decode_kernels, 1, 1) is on_gpu


def test_bad_decode_kernels_raise(model: qwen2.Qwen2) -> None:
    with pytest.raises(ValueError, match="decode kernels must be one of"):
        S.Sampler(model, decode_kernels="triton")
    with pytest.raises(ValueError, match="need the fused decode path"):
        S.Sampler(model, fused_decode=False, decode_kernels="pallas")
    cfg = model.config
    cache = qwen2.init_cache(cfg, 1, 8)
    with pytest.raises(ValueError, match="decode kernels must be one of"):
        decode.fused_decode(
            cfg,
            decode.fuse_decode_weights(model),
            jnp.zeros((1, 1), jnp.int32),
            jnp.zeros((1, 1), jnp.int32),
            jnp.ones((1, 1, 8), bool),
            cache,
            0,
            kernels="cuda",
        )


def test_kernels_lower_to_triton_for_the_real_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 0.5B layer shapes (two layers, bf16, batch 1) lower to Triton IR for a CUDA GPU from
    shapes alone: block sizes are powers of two, every primitive has a Triton lowering, the
    caches are updated in place. (PTX compilation and speed need the GPU.)"""
    hf = {**qwen2.PRESETS["qwen2.5-0.5b"], "num_hidden_layers": 2}
    cfg = qwen2.Qwen2Config.from_hf(hf, param_dtype="bfloat16", dtype="bfloat16")
    graphdef, state = nnx.split(qwen2.abstract(cfg))
    batch, length = 1, 1536
    kv = jax.ShapeDtypeStruct((batch, cfg.num_kv_heads, length, cfg.head_dim), jnp.bfloat16)
    cache = tuple(qwen2.LayerCache(kv, kv) for _ in range(cfg.num_layers))

    def step(state, tokens, positions, mask, cache, index, starts):
        model = nnx.merge(graphdef, state)
        weights = decode.fuse_decode_weights(model)
        rope = qwen2.rope_table(length, cfg.head_dim, cfg.rope_theta)
        return decode.fused_decode(
            cfg, weights, tokens, positions, mask, cache, index, "pallas", rope, starts
        )

    monkeypatch.setattr(dk, "_interpret", lambda interpret: False)  # as on the GPU
    text = (
        jax.jit(step)
        .trace(
            state,
            jax.ShapeDtypeStruct((batch, 1), jnp.int32),
            jax.ShapeDtypeStruct((batch, 1), jnp.int32),
            jax.ShapeDtypeStruct((batch, 1, length), jnp.bool_),
            cache,
            jax.ShapeDtypeStruct((), jnp.int32),
            jax.ShapeDtypeStruct((batch,), jnp.int32),
        )
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    calls = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
    # per layer: qkv, attention (split over the cache), combine, o_proj, gate_up, down; then
    # the final norm
    assert len(calls) == 6 * cfg.num_layers + 1
    # Nothing outside the kernels reads the mask or looks the RoPE table up: the one gather
    # left is the token's embedding.
    assert text.count('"stablehlo.gather"') == 1 and "tensor<1x1536xi32>" not in text
    assert sum("output_operand_alias" in line for line in calls) == cfg.num_layers


def _launch(fn, *args) -> tuple[tuple[int, int], int]:
    """(grid x, grid y) and warps of the one Triton kernel `fn` lowers to for a CUDA GPU."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    found = re.search(r"grid_x = (\d+).*?grid_y = (\d+).*?num_warps = (\d+)", text)
    assert found, "no Triton kernel in the lowered module"
    return (int(found[1]), int(found[2])), int(found[3])


@pytest.mark.parametrize(
    ("preset", "rows", "down_launch", "o_proj_launch"),
    [
        ("qwen2.5-0.5b", 1, ((896, 1), 8), ((224, 1), 4)),
        ("qwen2.5-0.5b", 2, ((448, 1), 4), ((224, 1), 4)),
        ("qwen2.5-1.5b", 1, ((1536, 1), 8), ((384, 1), 4)),
    ],
)
def test_one_row_down_takes_whole_exact_rows_on_eight_warps(
    preset: str,
    rows: int,
    down_launch: tuple[tuple[int, int], int],
    o_proj_launch: tuple[tuple[int, int], int],
) -> None:
    """At one token row the down projection's rows, padding to the tile budget and not a
    power of two, run one a program in exact spans on 8 warps (measured faster); two rows,
    and o_proj's narrow rows, keep their chunked blocks."""
    cfg = qwen2.Qwen2Config.from_hf(qwen2.PRESETS[preset])
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    bf16 = jnp.bfloat16
    residual = jax.ShapeDtypeStruct((rows, hidden), bf16)

    def matvec(x, w, res):
        return dk.matvec_residual(x, w, res, interpret=False)

    down = (jax.ShapeDtypeStruct((rows, inter), bf16), jax.ShapeDtypeStruct((hidden, inter), bf16))
    o_proj = (residual, jax.ShapeDtypeStruct((hidden, hidden), bf16))
    assert _launch(matvec, *down, residual) == down_launch
    assert _launch(matvec, *o_proj, residual) == o_proj_launch
    assert dk._wide_row(1, inter) and not dk._wide_row(2, inter)
    assert not dk._wide_row(1, 16384)  # a power of two has no masked span


@pytest.mark.parametrize(
    ("preset", "rows", "qkv_launch", "gate_up_warps"),
    [
        ("qwen2.5-0.5b", 1, ((18, 16), 2), 1),
        ("qwen2.5-0.5b", 2, ((18, 16), 4), 4),
        ("qwen2.5-1.5b", 1, ((16, 32), 4), 4),
    ],
)
def test_half_tiles_take_their_measured_launch_and_full_tiles_keep_four_warps(
    preset: str, rows: int, qkv_launch: tuple[tuple[int, int], int], gate_up_warps: int
) -> None:
    """0.5B's 896-wide rows fill half a tile: at one token row QKV runs 288 programs of 2
    warps and gate-up 1 warp (measured faster on an H200); two rows, and 1.5B's full tiles,
    keep 4 warps."""
    cfg = qwen2.Qwen2Config.from_hf(qwen2.PRESETS[preset])
    hidden, group = cfg.hidden_size, cfg.num_heads // cfg.num_kv_heads
    half = cfg.head_dim // 2
    bf16 = jnp.bfloat16
    x = jax.ShapeDtypeStruct((rows, hidden), bf16)
    qkv_w = jax.ShapeDtypeStruct((cfg.num_kv_heads, group + 2, cfg.head_dim, hidden), bf16)
    bias = jax.ShapeDtypeStruct(qkv_w.shape[:3], bf16)
    positions = jax.ShapeDtypeStruct((rows,), jnp.int32)
    inv_freq = jax.ShapeDtypeStruct((half,), jnp.float32)
    gate_up_w = jax.ShapeDtypeStruct((2, cfg.intermediate_size, hidden), bf16)

    def qkv(x, w, b, positions, inv_freq):
        return dk.qkv_rope(x, w, b, positions, inv_freq, eps=1e-6, interpret=False)

    def gate_up(x, w):
        return dk.gate_up_silu(x, w, eps=1e-6, interpret=False)

    assert _launch(qkv, x, qkv_w, bias, positions, inv_freq) == qkv_launch
    assert _launch(gate_up, x, gate_up_w)[1] == gate_up_warps
