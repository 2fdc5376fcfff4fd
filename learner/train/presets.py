"""The training presets, as data: {preset name: {section: {key: value}}}.

Each is a partial config over `config.TrainConfig`'s defaults (`config.load_config` checks
and types it like a config file); `learner.rl.config.PRESETS` adds the `rl` section's values
for the same names.
"""

from __future__ import annotations

from typing import Any

_QWEN25_7B = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_layers": 28,
    "num_heads": 28,
    "num_kv_heads": 4,
    "head_dim": 128,
    "tie_embeddings": False,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 32768,
}

PRESETS: dict[str, dict[str, Any]] = {
    # A 2-layer model and the project's BPE: minutes on 2 CPU cores.
    "tiny-cpu": {
        "run_dir": "runs/tiny-cpu",
        "model": {
            "tokenizer": "bpe",
            "tokenizer_vocab_size": 1024,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 2048,
        },
        "optim": {
            "lr": 3e-3,
            "warmup_steps": 10,
            "total_steps": 200,
            "weight_decay": 0.01,
        },
        "data": {"seq_len": 512, "batch_size": 8},
        "eval": {
            "every": 100,
            "heldout_batches": 4,
            "pass_at_1_problems": 4,
            "max_new_tokens": 256,
            "sample_batch": 4,
        },
        "checkpoint": {"every": 50, "keep": 2},
        "sandbox": {"workers": 2, "device": "cpu", "timeout_s": 120.0, "trials": 2},
        "log": {"every": 5},
    },
    # ~100M parameters from scratch (12 x 768, GQA 12/4, SwiGLU 2816, 8k BPE): one H100/H200,
    # 64k tokens a step (2 micro-batches of 16 rows x 2048), layers recomputed in backward.
    "100m-gpu": {
        "run_dir": "runs/100m-gpu",
        "model": {
            "tokenizer": "bpe",
            "tokenizer_vocab_size": 8192,
            "hidden_size": 768,
            "intermediate_size": 2816,
            "num_layers": 12,
            "num_heads": 12,
            "num_kv_heads": 4,
            "head_dim": 64,
            "max_position_embeddings": 4096,
            "logits_chunk": 512,
            "remat": True,
        },
        "optim": {"lr": 6e-4, "warmup_steps": 200, "total_steps": 4000, "grad_accum": 2},
        "data": {"seq_len": 2048, "batch_size": 16, "read_threads": 2},
        "eval": {
            "every": 500,
            "heldout_batches": 8,
            "pass_at_1_problems": 128,
            "max_new_tokens": 1024,
            "sample_batch": 64,
        },
        "checkpoint": {"every": 250, "keep": 3},
        "sandbox": {"workers": 8, "timing": False},
        "log": {"every": 10},
    },
    # Qwen2.5-7B(-Coder) from an HF checkpoint over many hosts; set model.path to it.
    "7b-cluster": {
        "run_dir": "runs/7b-cluster",
        "model": {
            "path": "checkpoints/Qwen2.5-Coder-7B",
            **_QWEN25_7B,
            "param_dtype": "float32",
            "compute_dtype": "bfloat16",
            "remat": True,
            "logits_chunk": 1024,
        },
        "optim": {
            "lr": 1e-5,
            "warmup_steps": 50,
            "total_steps": 2000,
            "weight_decay": 0.0,
            "grad_accum": 4,
        },
        "data": {"seq_len": 4096, "batch_size": 64, "read_threads": 4},
        "eval": {
            "every": 200,
            "heldout_batches": 16,
            "pass_at_1_problems": 512,
            "max_new_tokens": 2048,
            "sample_batch": 128,
        },
        "checkpoint": {"every": 100, "keep": 2, "async_save": True},
        "mesh": {"fsdp": -1, "tp": 4},
        "log": {"every": 10},
    },
}
