"""The policy a run trains: its tokenizer and its Qwen2 model, from the `model` config section.

A run starts either from a checkpoint directory (`model.path`: a model directory or an HF
checkpoint; its config.json gives the shape, and every non-zero dim in the section must
agree) or from scratch (every dim set; `vocab_size` 0 = the tokenizer's size rounded up to
64). The tokenizer is `model.tokenizer` (a directory), the path's own ("") or the project's
BPE trained on the run's pairs ("bpe", kept in RUN_DIR/tokenizer so a resumed run reads
the same one).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh

from learner import tokenizer as tokenizers
from learner.model import io, qwen2
from learner.train.config import ConfigError, ModelConfig

TOKENIZER_DIR = "tokenizer"
VOCAB_MULTIPLE = 64

# ModelConfig field -> Qwen2Config field, for the dims a checkpoint must agree with.
_DIMS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_layers",
    "num_heads": "num_heads",
    "num_kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
}


def compute_dtype(model: ModelConfig) -> str:
    """The compute dtype: "auto" is bfloat16 on accelerators and float32 on CPU."""
    if model.compute_dtype != "auto":
        return model.compute_dtype
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def tokenizer_source(model: ModelConfig, run_dir: Path) -> Path:
    """Where the run's tokenizer lives (for "bpe": RUN_DIR/tokenizer, trained if missing)."""
    if model.tokenizer == "bpe":
        return Path(run_dir) / TOKENIZER_DIR
    if model.tokenizer:
        return Path(model.tokenizer)
    if model.path:
        return Path(model.path)
    raise ConfigError("model.tokenizer is empty and there is no model.path to take it from")


def check_tokenizer(model: ModelConfig, run_dir: Path) -> None:
    """Fail early (before any compute) when the tokenizer cannot be found."""
    if model.tokenizer == "bpe":
        return
    where = tokenizer_source(model, run_dir)
    if not tokenizers.has_tokenizer(where):
        key = "model.tokenizer" if model.tokenizer else "model.path"
        raise ConfigError(f"{key}: {where} holds no tokenizer (tokenizer.json)")


def prepare_tokenizer(model: ModelConfig, run_dir: Path, texts: Sequence[str] = ()) -> Any:
    """The run's tokenizer; for "bpe", trained on `texts` once (process 0) and saved."""
    where = tokenizer_source(model, run_dir)
    if model.tokenizer == "bpe" and not tokenizers.has_tokenizer(where):
        if not texts:
            raise ConfigError("model.tokenizer=bpe needs training text (data.pairs)")
        trained = tokenizers.train_bpe(texts, vocab_size=model.tokenizer_vocab_size)
        if jax.process_index() == 0:
            tmp = where.with_name(where.name + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            trained.save_pretrained(str(tmp))
            tmp.rename(where)
        else:  # pragma: no cover - multi-host
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("tokenizer")
            return tokenizers.load_tokenizer(where)
        return tokenizers.load_tokenizer(where)
    return tokenizers.load_tokenizer(where)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _checkpoint_config(path: Path) -> dict[str, Any]:
    try:
        return io.read_json(Path(path) / "config.json")
    except io.ModelFormatError as err:
        raise ConfigError(f"model.path: {err}") from None


def qwen2_config(model: ModelConfig, tokenizer_size: int | None = None) -> qwen2.Qwen2Config:
    """The model's `Qwen2Config` (shape from the checkpoint or the section; dtypes, remat and
    attention from the section)."""
    numerics = {
        "param_dtype": model.param_dtype,
        "dtype": compute_dtype(model),
        "remat": model.remat,
        "attention_impl": model.attention_impl,
    }
    if model.path:
        if not Path(model.path).is_dir():
            raise ConfigError(f"model.path: {model.path} is not a directory")
        try:
            cfg = qwen2.Qwen2Config.from_hf(_checkpoint_config(Path(model.path)), **numerics)
        except (KeyError, ValueError, TypeError) as err:
            raise ConfigError(f"model.path: unsupported config.json ({err})") from None
        wrong = [
            f"{ours}={getattr(model, ours)} (checkpoint: {getattr(cfg, theirs)})"
            for ours, theirs in _DIMS.items()
            if getattr(model, ours) and getattr(model, ours) != getattr(cfg, theirs)
        ]
        if wrong:
            raise ConfigError(f"model.path {model.path} has another shape: {', '.join(wrong)}")
        return cfg
    vocab = model.vocab_size
    if not vocab:
        if tokenizer_size is None:
            raise ConfigError("model.vocab_size is 0 and no tokenizer gives the size")
        vocab = _round_up(tokenizer_size, VOCAB_MULTIPLE)
    missing = [name for name in _DIMS if name != "vocab_size" and not getattr(model, name)]
    if missing:
        raise ConfigError(f"a model from scratch needs model.{', model.'.join(missing)}")
    try:
        return qwen2.Qwen2Config(
            vocab_size=vocab,
            hidden_size=model.hidden_size,
            intermediate_size=model.intermediate_size,
            num_layers=model.num_layers,
            num_heads=model.num_heads,
            num_kv_heads=model.num_kv_heads,
            head_dim=model.head_dim,
            rope_theta=model.rope_theta,
            tie_word_embeddings=model.tie_embeddings,
            max_position_embeddings=model.max_position_embeddings,
            **numerics,
        )
    except ValueError as err:
        raise ConfigError(f"model: {err}") from None


def build_model(
    model: ModelConfig, cfg: qwen2.Qwen2Config, *, seed: int, mesh: Mesh | None
) -> qwen2.Qwen2:
    """The starting parameters: loaded from `model.path`, or drawn from `seed`."""
    if model.path:
        overrides = {"remat": cfg.remat, "attention_impl": cfg.attention_impl}
        try:
            loaded, _ = io.load(
                Path(model.path),
                param_dtype=cfg.param_dtype,
                dtype=cfg.dtype,
                mesh=mesh,
                **overrides,
            )
        except io.ModelFormatError as err:
            raise ConfigError(f"model.path: {err}") from None
        return loaded
    return io.random_model(cfg, seed=seed, mesh=mesh)


def hf_config_for(model: ModelConfig, cfg: qwen2.Qwen2Config) -> dict[str, Any]:
    """The HF config.json a saved copy of the trained model carries."""
    if model.path:
        base = _checkpoint_config(Path(model.path))
        base["torch_dtype"] = cfg.param_dtype
        base.pop("dtype", None)
        return base
    return cfg.to_hf()
