"""The Qwen2 parameter tables: Hugging Face weight map and partition rules, as data.

Paths are the dotted parameter paths of `qwen2.Qwen2` (`layers.3.attn.q_proj.kernel`);
`io` reads and writes checkpoints with `HF_MAPPING`, `sharding` places parameters with
`PARTITION_RULES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from learner.sharding import Rules

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


def hf_dtype_name(hf: Mapping[str, Any]) -> str | None:
    """The checkpoint dtype an HF config declares (`torch_dtype`, or `dtype` in transformers 5)."""
    name = hf.get("torch_dtype") or hf.get("dtype")
    return name if isinstance(name, str) else None
