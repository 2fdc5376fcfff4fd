"""Qwen2 (and Qwen2.5, Qwen2.5-Coder) in Flax NNX: config, pure math, KV cache, modules.

RMSNorm, rotary embeddings (half-split layout, theta from the config), grouped-query attention
with biases on q/k/v, SwiGLU MLP, tied or untied embeddings. The tables that describe the
parameters from outside (HF weight map, partition rules) are in `params`; the fused decode path
that only generation uses is in `learner.generate.decode`.

Layouts. Projections keep heads as their own dimension (`q_proj.kernel` is [hidden, heads,
head_dim]) so that tensor parallelism splits whole heads; the KV cache is [batch, kv_heads,
length, head_dim], which makes decode attention a plain batched matmul over the cache.

Precision. Parameters are stored in `param_dtype` and cast to `dtype` for compute; norms,
softmax and rotary angles run in float32; logits come out in float32.

Packed sequences. The uncached forward takes optional `segment_ids` [batch, time] (0 =
padding): a token attends only to earlier tokens of its own segment, and `positions` restart
per segment (`segment_positions`), so one row can hold several training examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.sharding import constrain

ARCHITECTURE = "qwen2"
_NEG_INF = -0.7 * float(jnp.finfo(jnp.float32).max)

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

DTYPES: dict[str, Any] = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "float16": jnp.float16,
}


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Shape and numerics of a Qwen2 model. Hashable, so it can be a static jit argument."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    param_dtype: str = "float32"
    dtype: str = "float32"
    # "xla" everywhere; "cudnn" uses cuDNN flash attention for uncached causal passes (training,
    # scoring) on NVIDIA GPUs, which needs a 16-bit `dtype`.
    attention_impl: str = "xla"
    # Recompute each layer's activations in the backward pass (saves memory in training).
    remat: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name} must be one of {sorted(DTYPES)}")
        if self.attention_impl not in ("xla", "cudnn"):
            raise ValueError("attention_impl must be 'xla' or 'cudnn'")

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self) -> Any:
        return DTYPES[self.param_dtype]

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], **overrides: Any) -> Qwen2Config:
        """Read an HF `config.json` dict; refuse features this implementation lacks."""
        model_type = hf.get("model_type")
        if model_type != "qwen2":
            raise ValueError(f"model_type is {model_type!r}, expected 'qwen2'")
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf.get('hidden_act')!r} is not supported")
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
        if rope_type not in (None, "default"):
            raise ValueError(f"rope type {rope_type!r} is not supported")
        heads = int(hf["num_attention_heads"])
        fields: dict[str, Any] = {
            "vocab_size": int(hf["vocab_size"]),
            "hidden_size": int(hf["hidden_size"]),
            "intermediate_size": int(hf["intermediate_size"]),
            "num_layers": int(hf["num_hidden_layers"]),
            "num_heads": heads,
            "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
            "head_dim": int(hf.get("head_dim") or hf["hidden_size"] // heads),
            "rope_theta": float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
            "max_position_embeddings": int(hf.get("max_position_embeddings", 32768)),
        }
        fields.update(overrides)
        return cls(**fields)

    def to_hf(self) -> dict[str, Any]:
        """A minimal HF `config.json` dict describing this model (for freshly built models)."""
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "torch_dtype": self.param_dtype,
        }


# HF configs of the public Qwen2.5 shapes (the Coder models share them), plus a tiny one for tests.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-1.5b": {
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
    },
    "qwen2.5-7b": {
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": False,
    },
}
for _preset in PRESETS.values():
    _preset.update(model_type="qwen2", hidden_act="silu", rms_norm_eps=1e-6)


# Activation layouts (batch over fsdp; heads and vocab over tp).
ACT_BTM: tuple[str | None, ...] = ("fsdp", None, None)
ACT_BTV: tuple[str | None, ...] = ("fsdp", None, "tp")
CACHE_BKSD: tuple[str | None, ...] = ("fsdp", "tp", None, None)


# --------------------------------------------------------------------------------------------
# Pure math
# --------------------------------------------------------------------------------------------


def inverse_rms(x: jax.Array, eps: float) -> jax.Array:
    """1 / rms(x) over the last axis, in float32, keeping that axis (size 1)."""
    x32 = x.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """x / rms(x) * scale, with the statistics in float32 (as HF computes them)."""
    normed = x.astype(jnp.float32) * inverse_rms(x, eps)
    return scale.astype(x.dtype) * normed.astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """RoPE's inverse frequencies, [head_dim // 2] float32 (HF's `inv_freq`).

    Made with NumPy, so a traced decode step embeds them as a constant: from jnp they were
    a kernel of their own every step.
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    # The power in float64 rounded once, as a correctly rounded float32 power would be.
    powers = (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)
    return np.float32(1.0) / powers


def rope_angles(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """sin and cos of position * inv_freq, [batch, time, head_dim // 2] in float32."""
    angles = positions.astype(jnp.float32)[..., None] * rope_frequencies(head_dim, theta)
    return jnp.sin(angles), jnp.cos(angles)


def rope_table(length: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """sin and cos of positions 0..length-1, [length, head_dim // 2] in float32: a decode
    loop looks its rows up once a step instead of computing them (on a GPU the multiply,
    the sine and the cosine were a small kernel each, every step), with the same values."""
    return rope_angles(jnp.arange(length), head_dim, theta)


def apply_rope(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotate [batch, time, heads, head_dim] by the angles (the first/second-half pairing)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    sin, cos = sin[:, :, None, :], cos[:, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention with shared KV heads.

    q: [B, T, H, D]; k, v: [B, K, S, D] with H a multiple of K; mask: [B, T, S] (True = attend).
    Scores and softmax in float32; a row with nothing to attend to gives a finite average.
    """
    b, t, h, d = q.shape
    kv = k.shape[1]
    q = q.reshape(b, t, kv, h // kv, d)
    scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None, :, :], scores * d**-0.5, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bksd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


def causal_mask(batch: int, length: int) -> jax.Array:
    """[batch, length, length] lower-triangular mask."""
    tri = jnp.tril(jnp.ones((length, length), dtype=bool))
    return jnp.broadcast_to(tri, (batch, length, length))


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """[batch, time, time] mask of packed rows: causal and within the same segment.

    segment_ids [batch, time]: one id per packed sequence, 0 for padding (padding attends only
    to padding, so its outputs are finite and meaningless: mask them out of any loss).
    """
    batch, length = segment_ids.shape
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return causal_mask(batch, length) & same


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Positions that restart at 0 where each segment starts, [batch, time] int32.

    A segment is a run of equal ids; a packer that writes its rows left to right gets the
    positions each sequence would have alone.
    """
    length = segment_ids.shape[-1]
    index = jnp.arange(length, dtype=jnp.int32)
    starts = jnp.concatenate(
        [
            jnp.ones_like(segment_ids[:, :1], dtype=bool),
            segment_ids[:, 1:] != segment_ids[:, :-1],
        ],
        axis=1,
    )
    first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return index - first


def output_logits(hidden: jax.Array, weight: jax.Array, *, tied: bool) -> jax.Array:
    """Float32 logits [..., vocab]: `weight` is the embedding table [V, M] if tied, else [M, V]."""
    spec = "...m,vm->...v" if tied else "...m,mv->...v"
    w = weight.astype(hidden.dtype)
    return jnp.einsum(spec, hidden, w, preferred_element_type=jnp.float32)


# --------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------


class LayerCache(NamedTuple):
    """Keys and values of one layer, [batch, kv_heads, length, head_dim]."""

    k: jax.Array
    v: jax.Array


Cache = tuple[LayerCache, ...]


def cached_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    cache: LayerCache | None,
    cache_index: jax.Array | int | None,
) -> tuple[jax.Array, LayerCache | None]:
    """Write k, v [B, T, K, D] into the cache (if any) and attend; the one home of cache semantics.

    Without a cache: attention among these tokens (causal unless `mask`). With `cache_index=None`:
    fill the cache from slot 0 and attend among these tokens. With `cache_index=i`: write at slot
    i and attend over the whole cache under `mask` [B, T, cache_length].
    """
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, D]
    if cache is not None:
        start = 0 if cache_index is None else cache_index
        ck = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (0, 0, start, 0))
        cv = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (0, 0, start, 0))
        cache = LayerCache(ck, cv)
        if cache_index is not None:  # extending: attend over everything cached so far
            k, v = ck.astype(q.dtype), cv.astype(q.dtype)
    if mask is None:
        mask = causal_mask(q.shape[0], q.shape[1])
    return grouped_attention(q, k, v, mask), cache


def init_cache(cfg: Qwen2Config, batch: int, length: int, dtype: Any = None) -> Cache:
    """An all-zero cache for `length` positions (call inside jit to allocate on device)."""
    shape = (batch, cfg.num_kv_heads, length, cfg.head_dim)
    dtype = dtype or cfg.compute_dtype

    def zeros() -> jax.Array:
        return constrain(jnp.zeros(shape, dtype), CACHE_BKSD)

    return tuple(LayerCache(zeros(), zeros()) for _ in range(cfg.num_layers))


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


def _param(kind: str, shape: tuple[int, ...], dtype: Any, rngs: nnx.Rngs | None) -> nnx.Param:
    """A parameter drawn like HF's init (normal(0, 0.02), zeros, ones); shape-only without rngs."""
    if rngs is None:
        return nnx.Param(jax.ShapeDtypeStruct(shape, dtype))
    if kind == "normal":
        return nnx.Param(
            (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
        )
    return nnx.Param(jnp.full(shape, 1.0 if kind == "ones" else 0.0, dtype))


class Einsum(nnx.Module):
    """A weight (and optional bias) applied by one einsum in the compute dtype."""

    def __init__(
        self,
        spec: str,
        shape: tuple[int, ...],
        cfg: Qwen2Config,
        *,
        rngs: nnx.Rngs | None,
        bias_shape: tuple[int, ...] | None = None,
    ) -> None:
        self.spec = spec
        self.dtype = cfg.compute_dtype
        self.kernel = _param("normal", shape, cfg.weight_dtype, rngs)
        self.bias = (
            None if bias_shape is None else _param("zeros", bias_shape, cfg.weight_dtype, rngs)
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jnp.einsum(self.spec, x.astype(self.dtype), self.kernel[...].astype(self.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, cfg: Qwen2Config, *, rngs: nnx.Rngs | None) -> None:
        self.eps = cfg.rms_norm_eps
        self.scale = _param("ones", (dim,), cfg.weight_dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


class Embedder(nnx.Module):
    """Token embedding; also the output projection when embeddings are tied."""

    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs | None) -> None:
        self.dtype = cfg.compute_dtype
        self.embedding = _param("normal", (cfg.vocab_size, cfg.hidden_size), cfg.weight_dtype, rngs)

    def encode(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)

    def decode(self, x: jax.Array) -> jax.Array:
        return output_logits(x, self.embedding[...], tied=True)


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs | None) -> None:
        m, h, k, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.impl = cfg.attention_impl
        self.q_proj = Einsum("btm,mhd->bthd", (m, h, d), cfg, rngs=rngs, bias_shape=(h, d))
        self.k_proj = Einsum("btm,mkd->btkd", (m, k, d), cfg, rngs=rngs, bias_shape=(k, d))
        self.v_proj = Einsum("btm,mkd->btkd", (m, k, d), cfg, rngs=rngs, bias_shape=(k, d))
        self.o_proj = Einsum("bthd,hdm->btm", (h, d, m), cfg, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        sin: jax.Array,
        cos: jax.Array,
        mask: jax.Array | None,
        cache: LayerCache | None,
        cache_index: jax.Array | None,
    ) -> tuple[jax.Array, LayerCache | None]:
        q = apply_rope(self.q_proj(x), sin, cos)
        k = apply_rope(self.k_proj(x), sin, cos)
        v = self.v_proj(x)
        if cache is None and mask is None and self.impl == "cudnn":
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            return self.o_proj(out), None
        out, cache = cached_attention(q, k, v, mask, cache, cache_index)
        return self.o_proj(out), cache


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs | None) -> None:
        m, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Einsum("btm,mf->btf", (m, f), cfg, rngs=rngs)
        self.up_proj = Einsum("btm,mf->btf", (m, f), cfg, rngs=rngs)
        self.down_proj = Einsum("btf,fm->btm", (f, m), cfg, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs | None) -> None:
        self.input_norm = RMSNorm(cfg.hidden_size, cfg, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        sin: jax.Array,
        cos: jax.Array,
        mask: jax.Array | None,
        cache: LayerCache | None,
        cache_index: jax.Array | None,
    ) -> tuple[jax.Array, LayerCache | None]:
        h, cache = self.attn(self.input_norm(x), sin, cos, mask, cache, cache_index)
        x = x + h
        x = x + self.mlp(self.post_attn_norm(x))
        return constrain(x, ACT_BTM), cache


def _run_layer(
    layer: DecoderLayer,
    x: jax.Array,
    sin: jax.Array,
    cos: jax.Array,
    mask: jax.Array | None,
    cache: LayerCache | None,
    cache_index: jax.Array | None,
) -> tuple[jax.Array, LayerCache | None]:
    return layer(x, sin, cos, mask, cache, cache_index)


class Qwen2(nnx.Module):
    """The decoder stack. Call it on tokens and positions; get float32 logits and the cache.

    Cache modes: no cache (training, scoring; causal unless `mask` or `segment_ids` say
    otherwise); a cache with `cache_index=None` fills it from slot 0 with these tokens and
    attends among them (prefill); a cache with `cache_index=i` writes these tokens at slot i and
    attends over the whole cache under `mask` [batch, time, cache_length] (decode).

    `rngs=None` builds the structure with shape-only parameters (`abstract`), which loaders fill.
    """

    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs | None) -> None:
        self.config = cfg
        self.embedder = Embedder(cfg, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg, rngs=rngs)
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Einsum("btm,mv->btv", (cfg.hidden_size, cfg.vocab_size), cfg, rngs=rngs)
        )

    def hidden_states(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array | None = None,
        cache: Cache | None = None,
        cache_index: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, Cache | None]:
        """Final-norm hidden states [batch, time, hidden] (before the output projection).

        `segment_ids` [batch, time] (uncached passes only; 0 = padding) packs several sequences
        in a row: attention stays causal within each segment, and `positions` should restart
        per segment (`segment_positions`).
        """
        if segment_ids is not None:
            mask = _packed_mask(tokens, segment_ids, mask, cache)
        cfg = self.config
        x = constrain(self.embedder.encode(tokens), ACT_BTM)
        sin, cos = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        run = nnx.remat(_run_layer) if cfg.remat else _run_layer
        new_cache: list[LayerCache] = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = run(
                layer, x, sin, cos, mask, None if cache is None else cache[i], cache_index
            )
            if layer_cache is not None:
                new_cache.append(layer_cache)
        return self.final_norm(x), (tuple(new_cache) if cache is not None else None)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [batch, time, vocab] from `hidden_states`."""
        if self.lm_head is None:
            out = self.embedder.decode(hidden)
        else:
            out = output_logits(hidden, self.lm_head.kernel[...], tied=False)
        return constrain(out, ACT_BTV)

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        mask: jax.Array | None = None,
        cache: Cache | None = None,
        cache_index: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
    ) -> tuple[jax.Array, Cache | None]:
        hidden, cache = self.hidden_states(
            tokens, positions, mask, cache, cache_index, segment_ids=segment_ids
        )
        return self.logits(hidden), cache


def _packed_mask(
    tokens: jax.Array, segment_ids: jax.Array, mask: jax.Array | None, cache: Cache | None
) -> jax.Array:
    """The attention mask of a packed uncached pass; a clear error for what it cannot serve."""
    if cache is not None:
        raise ValueError("segment_ids apply to uncached passes (scoring, training) only")
    if mask is not None:
        raise ValueError("pass either mask or segment_ids, not both")
    if segment_ids.shape != tokens.shape:
        raise ValueError(
            f"segment_ids shape {segment_ids.shape} differs from tokens shape {tokens.shape}"
        )
    return segment_mask(segment_ids)


def abstract(cfg: Qwen2Config) -> Qwen2:
    """The model's structure with shapes and dtypes only (no memory, no compute, no tracing)."""
    return Qwen2(cfg, rngs=None)
