"""Decoding with fused weights: the model's parameters regrouped for one token at a time.

`fuse_decode_weights` copies the parameters of a `Qwen2` into `DecodeWeights` once per decode
program; `fused_decode` is `Qwen2.__call__` in decode mode on them, on XLA's fusions or on the
Pallas kernels of `decode_kernels`. Only the sampler uses this; scoring and training run the
modules of `learner.model.qwen2`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from learner.generate import decode_kernels
from learner.model.qwen2 import (
    ACT_BTM,
    ACT_BTV,
    Cache,
    LayerCache,
    Qwen2,
    Qwen2Config,
    RMSNorm,
    apply_rope,
    cached_attention,
    inverse_rms,
    output_logits,
    rms_norm,
    rope_angles,
    rope_frequencies,
)
from learner.sharding import constrain

# Layouts of the fused decode weights (the parameters' own rules are `params.PARTITION_RULES`): the
# KV-head axis carries `tp`, so a split keeps each KV head's query heads, key and value together.
# Every projection has its contracted (input) dimension last, as HF stores it.
DECODE_QKV: tuple[str | None, ...] = ("tp", None, None, "fsdp")  # [kv, group + 2, hd, hidden]
DECODE_QKV_BIAS: tuple[str | None, ...] = ("tp", None, None)  # [kv, group + 2, hd]
DECODE_GATE_UP: tuple[str | None, ...] = (None, "tp", "fsdp")  # [2, inner, hidden]


class DecodeLayerWeights(NamedTuple):
    """One layer's weights regrouped so a single token needs two projections, not five.

    `qkv` [kv_heads, group + 2, head_dim, hidden] holds, per KV head, its `group` query heads (in
    the order q_proj has them), then its key, then its value; `gate_up` [2, inner, hidden] stacks
    gate over up, so a `tp` split of `inner` keeps each gate row beside its up row. `o_proj`
    [hidden, heads * head_dim] contracts one dimension: over (heads, head_dim) XLA:GPU wrote
    the [heads, head_dim, hidden] elementwise product out and reduced it in a second kernel.

    `qkv` and `gate_up` carry the scales of the RMSNorms before them (diag(scale) W): a
    token's projection reads the residual itself and scales its output by 1 / rms, where
    XLA:GPU wrote a normalised copy of the residual in a kernel of its own before each.

    Each projection contracts its last (contiguous) dimension, as HF stores it and as the
    tied output head [vocab, hidden] does: in a batch-1 profile of the 0.5B shape that head
    ran at 3.9 TB/s, while projections contracting their leading dimension became reduction
    kernels well below the bandwidth (XLA:GPU's column reductions keep few SMs busy when the
    output is short).
    """

    qkv: jax.Array
    qkv_bias: jax.Array
    o_proj: jax.Array
    gate_up: jax.Array
    down: jax.Array


class DecodeWeights(NamedTuple):
    """The whole model in decode layout, in the compute dtype; `head` is the embedding if tied."""

    embedding: jax.Array
    layers: tuple[DecodeLayerWeights, ...]
    final_norm: jax.Array
    head: jax.Array


def fuse_decode_weights(model: Qwen2) -> DecodeWeights:
    """Build the decode layout from the model's parameters (under jit, outside the decode loop).

    A copy of every projection: call it once per decode program, never per token. The
    parameters, their checkpoint mapping and their partition rules are untouched.
    """
    cfg = model.config
    kv, d = cfg.num_kv_heads, cfg.head_dim
    group = cfg.num_heads // kv

    def w(param: nnx.Param | None) -> jax.Array:
        if param is None:
            raise ValueError("Qwen2 projections q, k and v carry biases")
        return param[...].astype(cfg.compute_dtype)

    def scaled(weight: jax.Array, norm: RMSNorm) -> jax.Array:
        """diag(scale) W, the input dimension last; the product in float32, rounded once."""
        scale = norm.scale[...].astype(jnp.float32)
        return (weight.astype(jnp.float32) * scale).astype(cfg.compute_dtype)

    layers = []
    for layer in model.layers:
        attn, mlp = layer.attn, layer.mlp
        qkv = jnp.concatenate(
            [
                w(attn.q_proj.kernel).reshape(cfg.hidden_size, kv, group, d),
                w(attn.k_proj.kernel)[:, :, None],
                w(attn.v_proj.kernel)[:, :, None],
            ],
            axis=2,
        ).transpose(1, 2, 3, 0)
        qkv = scaled(qkv, layer.input_norm)
        qkv_bias = jnp.concatenate(
            [
                w(attn.q_proj.bias).reshape(kv, group, d),
                w(attn.k_proj.bias)[:, None],
                w(attn.v_proj.bias)[:, None],
            ],
            axis=1,
        )
        gate_up = jnp.stack([w(mlp.gate_proj.kernel).T, w(mlp.up_proj.kernel).T], axis=0)
        gate_up = scaled(gate_up, layer.post_attn_norm)
        layers.append(
            DecodeLayerWeights(
                qkv=constrain(qkv, DECODE_QKV),
                qkv_bias=constrain(qkv_bias, DECODE_QKV_BIAS),
                o_proj=w(attn.o_proj.kernel).reshape(cfg.num_heads * d, cfg.hidden_size).T,
                gate_up=constrain(gate_up, DECODE_GATE_UP),
                down=w(mlp.down_proj.kernel).T,
            )
        )
    embedding = w(model.embedder.embedding)
    head = embedding if model.lm_head is None else w(model.lm_head.kernel)
    return DecodeWeights(embedding, tuple(layers), w(model.final_norm.scale), head)


def _fused_layer(
    cfg: Qwen2Config,
    w: DecodeLayerWeights,
    x: jax.Array,
    sin: jax.Array,
    cos: jax.Array,
    mask: jax.Array,
    cache: LayerCache,
    cache_index: jax.Array | int,
) -> tuple[jax.Array, LayerCache]:
    """`DecoderLayer` on `DecodeLayerWeights`: four projections instead of seven (same math)."""
    b, t, _ = x.shape
    kv, d = cfg.num_kv_heads, cfg.head_dim
    group = cfg.num_heads // kv
    eps = cfg.rms_norm_eps
    y = jnp.einsum("btm,kjdm->btkjd", x, w.qkv, preferred_element_type=jnp.float32)
    y = (y * inverse_rms(x, eps)[..., None, None]).astype(x.dtype) + w.qkv_bias
    qk = apply_rope(y[:, :, :, : group + 1].reshape(b, t, kv * (group + 1), d), sin, cos)
    qk = qk.reshape(b, t, kv, group + 1, d)
    q = qk[:, :, :, :group].reshape(b, t, cfg.num_heads, d)
    out, cache_out = cached_attention(
        q, qk[:, :, :, group], y[:, :, :, group + 1], mask, cache, cache_index
    )
    assert cache_out is not None
    x = x + jnp.einsum("btf,mf->btm", out.reshape(b, t, cfg.num_heads * d), w.o_proj)
    gate_up = jnp.einsum("btm,cfm->btcf", x, w.gate_up, preferred_element_type=jnp.float32)
    gate_up = (gate_up * inverse_rms(x, eps)[..., None]).astype(x.dtype)
    x = x + jnp.einsum("btf,mf->btm", jax.nn.silu(gate_up[:, :, 0]) * gate_up[:, :, 1], w.down)
    return constrain(x, ACT_BTM), cache_out


# Kernels of `fused_decode`: XLA's own fusions, the Pallas kernels of `decode_kernels`, or
# "auto": the Pallas kernels where they were measured faster (see `AUTO_PALLAS_ROWS`).
DECODE_KERNELS = ("auto", "xla", "pallas")

# Token rows up to which "auto" picks the Pallas kernels on a GPU. On an H200 (0.5B and 1.5B
# shapes, prompt 512) they beat XLA's fusions by 33% and 32% at one row and by 29% and 8% at
# two, and lose by 45% and 55% at eight, where a step is no longer bound by launches.
AUTO_PALLAS_ROWS = 2


def check_decode_kernels(kernels: str) -> None:
    """Raise a ValueError naming the choices unless `kernels` is one of `DECODE_KERNELS`."""
    if kernels not in DECODE_KERNELS:
        raise ValueError(f"decode kernels must be one of {DECODE_KERNELS}, got {kernels!r}")


def uses_pallas(kernels: str, batch: int, time: int, backend: str | None = None) -> bool:
    """Whether a decode call of `batch` rows and `time` new tokens runs the Pallas kernels.

    They serve one new token per row, few rows, and no mesh of more than one device (the
    kernels see whole, unsharded weights); "auto" also asks for a GPU (elsewhere they would
    run in Pallas' interpreter) and at most `AUTO_PALLAS_ROWS` rows.
    """
    if kernels == "xla" or time != 1 or batch > decode_kernels.MAX_ROWS:
        return False
    mesh = jax.sharding.get_abstract_mesh()
    if not (mesh.empty or mesh.size == 1):
        return False
    if kernels == "auto":
        backend = backend or jax.default_backend()
        return backend == "gpu" and batch <= AUTO_PALLAS_ROWS
    return True


class _PallasStep(NamedTuple):
    """What every layer's Pallas kernels share in one decode step (made once a step)."""

    positions: jax.Array  # [R]: the QKV kernel makes each row's RoPE angles from its position
    inv_freq: jax.Array  # [head_dim // 2]
    mask: jax.Array | None  # [R, cache_length] int32, or None with `starts`
    starts: jax.Array | None  # [R]: each row attends to slots starts..index
    index: jax.Array  # [1]: the cache slot of the new token


def _pallas_layer(
    cfg: Qwen2Config, w: DecodeLayerWeights, x: jax.Array, step: _PallasStep, cache: LayerCache
) -> tuple[jax.Array, LayerCache]:
    """`_fused_layer` for one token per row (x [R, hidden]) as five Pallas kernels (six with
    a split cache)."""
    eps = cfg.rms_norm_eps
    qkv = decode_kernels.qkv_rope(x, w.qkv, w.qkv_bias, step.positions, step.inv_freq, eps=eps)
    out, k, v = decode_kernels.attention(
        qkv, step.mask, cache.k, cache.v, step.index, starts=step.starts
    )
    x = decode_kernels.matvec_residual(out, w.o_proj, x)
    x = decode_kernels.matvec_residual(
        decode_kernels.gate_up_silu(x, w.gate_up, eps=eps), w.down, x
    )
    return x, LayerCache(k, v)


def _pallas_step(
    cfg: Qwen2Config,
    positions: jax.Array,
    mask: jax.Array,
    cache_index: jax.Array | int,
    starts: jax.Array | None,
) -> _PallasStep:
    """The per-step inputs of `_pallas_layer`, made once a step rather than once a layer."""
    b = positions.shape[0]
    index = jnp.asarray(cache_index, jnp.int32).reshape(1)
    rows = jnp.asarray(positions, jnp.int32).reshape(b)
    inv_freq = rope_frequencies(cfg.head_dim, cfg.rope_theta)
    if starts is None:
        return _PallasStep(rows, inv_freq, mask.reshape(b, -1).astype(jnp.int32), None, index)
    return _PallasStep(rows, inv_freq, None, jnp.asarray(starts, jnp.int32).reshape(b), index)


def fused_decode(
    cfg: Qwen2Config,
    weights: DecodeWeights,
    tokens: jax.Array | None,
    positions: jax.Array,
    mask: jax.Array | None,
    cache: Cache,
    cache_index: jax.Array | int,
    kernels: str = "auto",
    rope: tuple[jax.Array, jax.Array] | None = None,
    starts: jax.Array | None = None,
    embedded: jax.Array | None = None,
) -> tuple[jax.Array, Cache]:
    """`Qwen2.__call__` in decode mode (write at `cache_index`, attend under `mask`), fused.

    tokens, positions [B, T]; mask [B, T, cache_length]. `embedded` [B, T, hidden] replaces
    tokens when the caller looked their rows up itself (`greedy_kernels.greedy_update` does,
    in the kernel that picks them). Returns float32 logits [B, T, vocab]
    and the updated cache; equal to the module path up to the rounding of the wider GEMMs.
    `rope`: a `rope_table` covering every position, to look the angles' sin and cos up in
    (the XLA layers; the Pallas QKV kernel makes them from each row's position). `starts` [B]: each row's first attended
    slot, given only when `mask` is exactly the slots from there to `cache_index` (as a
    decode loop's is): the Pallas attention then makes the mask itself. Both save small XLA
    kernels a step, which at batch 1 cost about as much as a layer's own.

    `kernels="pallas"` runs each layer as the hand-written kernels of `decode_kernels` when
    they apply (T = 1, B <= `decode_kernels.MAX_ROWS`, a single device; else the XLA layers,
    silently): at batch 1 a step is bound by kernel launches, and XLA:GPU launches ~15 a layer.
    "auto" does so on a GPU for the few rows where they are faster (`uses_pallas`), and
    then the final norm too. The embedding lookup and output head stay XLA's in every case.
    """
    check_decode_kernels(kernels)
    if (tokens is None) == (embedded is None):
        raise ValueError("fused_decode takes tokens or their embedded rows, exactly one of them")
    x = embedded if embedded is not None else jnp.take(weights.embedding, tokens, axis=0)
    x = constrain(x, ACT_BTM)
    b, t, m = x.shape
    new_cache = []
    if uses_pallas(kernels, b, t):
        step = _pallas_step(cfg, positions, mask, cache_index, starts)
        rows = x.reshape(b, m)
        for w, layer_cache in zip(weights.layers, cache, strict=True):
            rows, layer_cache = _pallas_layer(cfg, w, rows, step, layer_cache)
            new_cache.append(layer_cache)
        normed = decode_kernels.rms_norm(rows, weights.final_norm, eps=cfg.rms_norm_eps)
        hidden = normed.reshape(b, t, m)
    else:
        if rope is None:
            sin, cos = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        else:
            sin, cos = (jnp.take(table, positions, axis=0, mode="clip") for table in rope)
        for w, layer_cache in zip(weights.layers, cache, strict=True):
            x, layer_cache = _fused_layer(cfg, w, x, sin, cos, mask, layer_cache, cache_index)
            new_cache.append(layer_cache)
        hidden = rms_norm(x, weights.final_norm, cfg.rms_norm_eps)
    logits = output_logits(hidden, weights.head, tied=cfg.tie_word_embeddings)
    return constrain(logits, ACT_BTV), tuple(new_cache)
