"""Qwen2 (and Qwen2.5, Qwen2.5-Coder) in Flax NNX.

RMSNorm, rotary embeddings (half-split layout, theta from the config), grouped-query attention
with biases on q/k/v, SwiGLU MLP, tied or untied embeddings. Everything the rest of the system
needs to know about this architecture lives here as data: the config parser, the partition
rules and the table that maps Hugging Face tensor names onto ours.

Layouts. Projections keep heads as their own dimension (`q_proj.kernel` is [hidden, heads,
head_dim]) so that tensor parallelism splits whole heads; the KV cache is [batch, kv_heads,
length, head_dim], which makes decode attention a plain batched matmul over the cache.

Precision. Parameters are stored in `param_dtype` and cast to `dtype` for compute; norms,
softmax and rotary angles run in float32; logits come out in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner import decode_kernels
from learner.sharding import Rules, constrain

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


def hf_dtype_name(hf: Mapping[str, Any]) -> str | None:
    """The checkpoint dtype an HF config declares (`torch_dtype`, or `dtype` in transformers 5)."""
    name = hf.get("torch_dtype") or hf.get("dtype")
    return name if isinstance(name, str) else None


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


# --------------------------------------------------------------------------------------------
# Data: partition rules and the Hugging Face weight map
# --------------------------------------------------------------------------------------------

# (regex over the dotted parameter path, mesh axis per dimension)
PARTITION_RULES: Rules = (
    (r"embedder\.embedding", ("tp", "fsdp")),  # [vocab, hidden]
    (r"layers\.\d+\.attn\.[qkv]_proj\.kernel", ("fsdp", "tp", None)),  # [hidden, heads, hd]
    (r"layers\.\d+\.attn\.[qkv]_proj\.bias", ("tp", None)),  # [heads, hd]
    (r"layers\.\d+\.attn\.o_proj\.kernel", ("tp", None, "fsdp")),  # [heads, hd, hidden]
    (r"layers\.\d+\.mlp\.(gate|up)_proj\.kernel", ("fsdp", "tp")),  # [hidden, inner]
    (r"layers\.\d+\.mlp\.down_proj\.kernel", ("tp", "fsdp")),  # [inner, hidden]
    (r"(layers\.\d+\.)?\w*norm\.scale", (None,)),  # [hidden]
    (r"lm_head\.kernel", ("fsdp", "tp")),  # [hidden, vocab]
)

# Activation layouts (batch over fsdp; heads and vocab over tp).
ACT_BTM: tuple[str | None, ...] = ("fsdp", None, None)
ACT_BTV: tuple[str | None, ...] = ("fsdp", None, "tp")
CACHE_BKSD: tuple[str | None, ...] = ("fsdp", "tp", None, None)

# (HF tensor name, our parameter path, layout change); "{i}" stands for the layer index.
# Layout changes: "none"; "transpose" ([out, in] -> [in, out]); "heads_in" ([heads*hd, hidden]
# -> [hidden, heads, hd]); "heads_bias" ([heads*hd] -> [heads, hd]); "heads_out"
# ([hidden, heads*hd] -> [heads, hd, hidden]). All are permutations: round trips are exact.
HF_MAPPING: tuple[tuple[str, str, str], ...] = (
    ("model.embed_tokens.weight", "embedder.embedding", "none"),
    ("model.norm.weight", "final_norm.scale", "none"),
    ("lm_head.weight", "lm_head.kernel", "transpose"),
    ("model.layers.{i}.input_layernorm.weight", "layers.{i}.input_norm.scale", "none"),
    ("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attn_norm.scale", "none"),
    ("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attn.q_proj.kernel", "heads_in"),
    ("model.layers.{i}.self_attn.q_proj.bias", "layers.{i}.attn.q_proj.bias", "heads_bias"),
    ("model.layers.{i}.self_attn.k_proj.weight", "layers.{i}.attn.k_proj.kernel", "heads_in"),
    ("model.layers.{i}.self_attn.k_proj.bias", "layers.{i}.attn.k_proj.bias", "heads_bias"),
    ("model.layers.{i}.self_attn.v_proj.weight", "layers.{i}.attn.v_proj.kernel", "heads_in"),
    ("model.layers.{i}.self_attn.v_proj.bias", "layers.{i}.attn.v_proj.bias", "heads_bias"),
    ("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attn.o_proj.kernel", "heads_out"),
    ("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate_proj.kernel", "transpose"),
    ("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up_proj.kernel", "transpose"),
    ("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down_proj.kernel", "transpose"),
)

# HF tensors that carry no information of their own (recomputed here) and may be skipped.
HF_IGNORED = (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",)


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

    Cache modes: no cache (training, scoring; causal unless `mask` says otherwise); a cache with
    `cache_index=None` fills it from slot 0 with these tokens and attends among them (prefill);
    a cache with `cache_index=i` writes these tokens at slot i and attends over the whole cache
    under `mask` [batch, time, cache_length] (decode).

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
    ) -> tuple[jax.Array, Cache | None]:
        """Final-norm hidden states [batch, time, hidden] (before the output projection)."""
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
    ) -> tuple[jax.Array, Cache | None]:
        hidden, cache = self.hidden_states(tokens, positions, mask, cache, cache_index)
        return self.logits(hidden), cache


def abstract(cfg: Qwen2Config) -> Qwen2:
    """The model's structure with shapes and dtypes only (no memory, no compute, no tracing)."""
    return Qwen2(cfg, rngs=None)


# --------------------------------------------------------------------------------------------
# Decode with fused weights
# --------------------------------------------------------------------------------------------

# Layouts of the fused decode weights (the parameters' own rules are PARTITION_RULES above): the
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
