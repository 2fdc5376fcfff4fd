"""Shared fixtures: tiny random Qwen2 checkpoints written by transformers itself."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest

# LLVM's optimisation passes dominate XLA:CPU compile time and these tests compile much more
# than they run; -O0 roughly halves the suite. Read when jax first starts a backend.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()


@pytest.fixture(autouse=True)
def _exact_float32() -> Iterator[None]:
    """float32 comparisons in float32: on a GPU, XLA's default matmuls round to TF32."""
    with jax.default_matmul_precision("highest"):
        yield


TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
}


def write_hf_checkpoint(
    out: Path, *, tied: bool, dtype: str = "float32", seed: int = 0, **save_kwargs
) -> Path:
    """A transformers Qwen2ForCausalLM with every tensor random (norms and biases included)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=tied))
    with torch.no_grad():
        for name, param in model.named_parameters():
            base = 1.0 if name.endswith("layernorm.weight") or name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.2 * torch.randn_like(param))
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(out, **save_kwargs)
    return out


@pytest.fixture(scope="session")
def hf_untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf_untied"), tied=False)


@pytest.fixture(scope="session")
def hf_tied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf_tied"), tied=True, seed=1)


def random_tiny_model(*, tied: bool = False, seed: int = 0, dtype: str = "float32", **overrides):
    """A tiny model drawn with numpy (no torch, no compile), weights ~ N(0, 0.2) so that greedy
    decoding is not degenerate."""
    import numpy as np

    from learner.model import io as model_io
    from learner.model import qwen2

    config = {**TINY, "model_type": "qwen2", "tie_word_embeddings": tied, **overrides}
    cfg = qwen2.Qwen2Config.from_hf(config, param_dtype=dtype, dtype=dtype)
    skeleton = qwen2.abstract(cfg)
    rng = np.random.default_rng(seed)
    params = {}
    for path, x in sorted(model_io.flat_params(skeleton).items()):
        base = 1.0 if path.endswith(".scale") else 0.0
        params[path] = (base + 0.2 * rng.standard_normal(x.shape)).astype(x.dtype)
    return model_io.with_params(skeleton, params)


@pytest.fixture(scope="session")
def tiny_model():
    return random_tiny_model()
