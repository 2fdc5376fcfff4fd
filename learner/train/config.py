"""Training configuration: frozen dataclasses per section, presets as data, typed overrides.

A run is described by one `TrainConfig` (sections `model`, `optim`, `data`, `eval`,
`checkpoint`, `sandbox`, `mesh`, `log`, `rl`). It comes from a preset name (`PRESETS`) or a
JSON/TOML file, then `--set section.key=value` overrides, each parsed by the field's type:

    int, float, str, bool (true/false/1/0/yes/no), tuples as comma-separated values
    (`data.pairs=a.jsonl,b.jsonl`; an empty value is the empty tuple).

Unknown sections or keys are a `ConfigError` that lists the valid ones, so a typo never runs.
A config file is a (possibly partial) nested dict; a top-level `preset = "tiny-cpu"` starts it
from a preset. `config_to_dict` / `config_from_dict` round-trip through JSON:
RUN_DIR/config.json is written at the start of a run and a resumed run must match it except
for the fields in `RESUME_MUTABLE` (those that do not change the parameters' trajectory).

The `rl` section is `learner.rl.config.RLConfig`; that module may also define `PRESETS`
({preset name: {key: value}}, merged into the `rl` section of our presets) and
`RESUME_MUTABLE` (keys under `rl.` that may change on resume).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from learner.rl.config import RLConfig
from learner.train.presets import PRESETS


class ConfigError(ValueError):
    """A configuration that cannot be used: unknown key, bad value, mismatch on resume."""


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The policy: from a checkpoint directory (`path`) or built from scratch (the dims).

    With `path` set the directory's config.json gives the shape; any non-zero dim here must
    agree with it (a check, so a preset cannot silently train another model). From scratch
    every dim must be set; `vocab_size` 0 takes the tokenizer's size rounded up to 64.
    `tokenizer`: a tokenizer directory; "" = the one in `path`; "bpe" = train the project's
    byte-level BPE (`tokenizer_vocab_size` entries) on the training pairs, saved in
    RUN_DIR/tokenizer and reused on resume.
    """

    path: str = ""
    tokenizer: str = ""
    tokenizer_vocab_size: int = 4096
    vocab_size: int = 0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    param_dtype: str = "float32"
    # "auto": bfloat16 on GPU/TPU, float32 on CPU.
    compute_dtype: str = "auto"
    attention_impl: str = "xla"
    remat: bool = False
    # Output projection and its softmax `logits_chunk` positions at a time (0 = all at once).
    logits_chunk: int = 0


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to `end_lr_ratio * lr`, global-norm
    clipping, `grad_accum` micro-batches per step. `decay_steps` 0 = `total_steps`."""

    lr: float = 3e-4
    warmup_steps: int = 100
    total_steps: int = 1000
    decay_steps: int = 0
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float = 1.0
    grad_accum: int = 1


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Teacher pairs (SFT) and synth programs (RL prompts). `batch_size` is global rows per
    micro-batch; a step sees `batch_size * optim.grad_accum` rows. `levels` () = all."""

    pairs: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    seq_len: int = 1024
    batch_size: int = 8
    levels: tuple[int, ...] = ()
    heldout_fraction: float = 0.05
    heldout_salt: str = ""
    truncate: bool = False
    seed: int = 0
    read_threads: int = 0


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Every `every` steps (0 = never; also after the last step when `at_end`): held-out loss
    over `heldout_batches` batches (0 = all) and pass@1 on `pass_at_1_problems` held-out
    prompts (0 = off), sampled greedily at `temperature` 0."""

    every: int = 0
    at_end: bool = True
    heldout_batches: int = 0
    batch_size: int = 0  # rows per held-out loss batch; 0 = data.batch_size
    pass_at_1_problems: int = 0
    max_new_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    sample_batch: int = 16  # prompts per sampler call


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Save every `every` steps (and at the end), keep the newest `keep`."""

    every: int = 100
    keep: int = 3
    async_save: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """The verifier fleet: `servers` ("host:port", ...) or ("local",), which starts a CPU/GPU
    sandbox server subprocess with `workers` graders for the run's lifetime."""

    servers: tuple[str, ...] = ("local",)
    timeout_s: float = 300.0
    retries: int = 4
    trials: int = 3
    timing: bool = False
    concurrency: int = 32
    workers: int = 2
    device: str = "auto"
    allow_weak_isolation: bool = False


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """`learner.sharding.make_mesh(fsdp, tp)`; -1 = the devices left over."""

    fsdp: int = -1
    tp: int = 1


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """Metrics every `every` steps to RUN_DIR/metrics.jsonl (+ TensorBoard), a progress bar."""

    every: int = 10
    tensorboard: bool = True
    progress: bool = True


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "runs/default"
    seed: int = 0
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)


# Keys (or `section.` prefixes) a resumed run may change: none alters the parameters' path.
RESUME_MUTABLE: tuple[str, ...] = (
    "run_dir",
    "optim.total_steps",
    "eval.",
    "checkpoint.",
    "sandbox.",
    "mesh.",
    "log.",
    "data.read_threads",
)


# --------------------------------------------------------------------------------------------
# Presets (the dicts are in `presets`)
# --------------------------------------------------------------------------------------------


def preset_names() -> list[str]:
    return sorted(PRESETS)


def _rl_module_attr(name: str, default: Any) -> Any:
    import learner.rl.config as rl_config

    return getattr(rl_config, name, default)


def preset_dict(name: str) -> dict[str, Any]:
    """A preset as a nested dict (a deep copy), with the RL module's additions for it."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: expected one of {', '.join(preset_names())}")
    out = json.loads(json.dumps(PRESETS[name]))
    rl_extra = _rl_module_attr("PRESETS", {}).get(name)
    if rl_extra:
        out["rl"] = {**json.loads(json.dumps(rl_extra)), **out.get("rl", {})}
    return out


# --------------------------------------------------------------------------------------------
# Typed values
# --------------------------------------------------------------------------------------------

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse_scalar(kind: Any, text: str, key: str) -> Any:
    text = text.strip()
    try:
        if kind is bool:
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        raise ConfigError(f"{key}: {text!r} is not a valid {kind.__name__}") from None
    if kind is str:
        return text
    raise ConfigError(f"{key}: fields of type {kind} cannot be set from the command line")


def _tuple_item_type(kind: Any) -> Any | None:
    if typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
    return None


def parse_value(kind: Any, text: str, key: str) -> Any:
    """A command-line string as a value of the field type `kind`."""
    item = _tuple_item_type(kind)
    if item is not None:
        return tuple(_parse_scalar(item, part, key) for part in text.split(",") if part.strip())
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if text.strip().lower() in ("none", "null") and len(options) < len(typing.get_args(kind)):
            return None
        if len(options) == 1:
            return parse_value(options[0], text, key)
    return _parse_scalar(kind, text, key)


def _check_value(kind: Any, value: Any, key: str) -> Any:
    """A JSON/TOML value as a value of the field type `kind` (lists become tuples)."""
    item = _tuple_item_type(kind)
    if item is not None:
        if isinstance(value, str):
            return parse_value(kind, value, key)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_check_value(item, v, key) for v in value)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(kind):
            return None
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(options) == 1:
            return _check_value(options[0], value, key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str, bool):
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}")
    if dataclasses.is_dataclass(kind):
        raise ConfigError(f"{key}: expected a section (a table of keys), got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# Building, overriding, round trips
# --------------------------------------------------------------------------------------------


def _valid_keys(cls: type, prefix: str = "") -> list[str]:
    return [f"{prefix}{f.name}" for f in dataclasses.fields(cls)]


def _unknown(key: str, cls: type, prefix: str) -> ConfigError:
    valid = ", ".join(_valid_keys(cls, prefix))
    return ConfigError(f"unknown key {key!r}; valid keys here: {valid}")


def _build(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """`cls` from a nested dict, every key checked and every value typed."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a table, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown(prefix + key, cls, prefix)
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            kwargs[key] = _build(kind, value, f"{prefix}{key}.")
        else:
            kwargs[key] = _check_value(kind, value, prefix + key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        if isinstance(err, ConfigError):
            raise
        where = prefix.rstrip(".") or "config"
        message = str(err)
        raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A nested, JSON-able dict (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    return _build(TrainConfig, data)


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid {path.suffix[1:] or 'JSON'} ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds a table of sections")
    return data


def base_dict(preset_or_path: str) -> dict[str, Any]:
    """The nested dict a preset name or a config file stands for (before overrides)."""
    if preset_or_path in PRESETS:
        return preset_dict(preset_or_path)
    path = Path(preset_or_path)
    if not path.suffix and not path.exists():
        raise ConfigError(
            f"unknown preset {preset_or_path!r}: expected one of {', '.join(preset_names())} "
            "or a .json/.toml config file"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    data = _read_file(path)
    base = data.pop("preset", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: `preset` must be a preset name")
        data = _merge(preset_dict(base), data)
    return data


def apply_override(data: dict[str, Any], override: str) -> dict[str, Any]:
    """`section.key=value` applied to a nested dict, the value typed by the field it names."""
    if "=" not in override:
        raise ConfigError(f"--set wants section.key=value, got {override!r}")
    key, text = override.split("=", 1)
    parts = key.strip().split(".")
    cls: type = TrainConfig
    node = data
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth]) + ("." if depth else "")
        hints = _hints(cls)
        if part not in hints:
            raise _unknown(key.strip(), cls, prefix)
        kind = hints[part]
        if dataclasses.is_dataclass(kind):
            if depth == len(parts) - 1:
                raise ConfigError(
                    f"{key.strip()} is a section; set one of its keys: "
                    + ", ".join(_valid_keys(kind, key.strip() + "."))
                )
            sub = node.get(part)
            node[part] = dict(sub) if isinstance(sub, Mapping) else {}
            node, cls = node[part], kind
            continue
        if depth != len(parts) - 1:
            raise ConfigError(f"{'.'.join(parts[: depth + 1])} is not a section")
        node[part] = parse_value(kind, text, key.strip())
    return data


def load_config(preset_or_path: str, overrides: Sequence[str] = ()) -> TrainConfig:
    """A preset or config file, then `section.key=value` overrides, checked and typed."""
    data = base_dict(preset_or_path)
    for override in overrides:
        data = apply_override(data, override)
    cfg = config_from_dict(data)
    validate(cfg)
    return cfg


def validate(cfg: TrainConfig) -> None:
    """Value checks that span fields (each message names the key)."""
    checks = [
        (cfg.optim.total_steps >= 1, "optim.total_steps must be at least 1"),
        (cfg.optim.grad_accum >= 1, "optim.grad_accum must be at least 1"),
        (cfg.optim.lr > 0, "optim.lr must be positive"),
        (cfg.optim.warmup_steps >= 0, "optim.warmup_steps must be >= 0"),
        (cfg.optim.clip_norm >= 0, "optim.clip_norm must be >= 0 (0 = no clipping)"),
        (0 <= cfg.optim.end_lr_ratio <= 1, "optim.end_lr_ratio must be in [0, 1]"),
        (cfg.data.batch_size >= 1, "data.batch_size must be at least 1"),
        (cfg.data.seq_len >= 2, "data.seq_len must be at least 2"),
        (0 <= cfg.data.heldout_fraction <= 1, "data.heldout_fraction must be in [0, 1]"),
        (cfg.checkpoint.every >= 1, "checkpoint.every must be at least 1"),
        (cfg.checkpoint.keep >= 1, "checkpoint.keep must be at least 1"),
        (cfg.eval.every >= 0, "eval.every must be >= 0"),
        (cfg.log.every >= 1, "log.every must be at least 1"),
        (cfg.mesh.tp >= 1, "mesh.tp must be at least 1"),
        (cfg.mesh.fsdp == -1 or cfg.mesh.fsdp >= 1, "mesh.fsdp must be -1 or at least 1"),
        (bool(cfg.sandbox.servers), "sandbox.servers must name servers or be 'local'"),
        (
            cfg.model.param_dtype in ("float32", "bfloat16"),
            "model.param_dtype must be float32 or bfloat16",
        ),
        (
            cfg.model.compute_dtype in ("auto", "float32", "bfloat16"),
            "model.compute_dtype must be auto, float32 or bfloat16",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if "local" in cfg.sandbox.servers and len(cfg.sandbox.servers) > 1:
        raise ConfigError("sandbox.servers: 'local' cannot be mixed with server addresses")


# --------------------------------------------------------------------------------------------
# Resume
# --------------------------------------------------------------------------------------------


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resume_mutable() -> tuple[str, ...]:
    rl = tuple(f"rl.{key}" for key in _rl_module_attr("RESUME_MUTABLE", ()))
    return RESUME_MUTABLE + rl


def config_differences(saved: Mapping[str, Any], current: TrainConfig) -> list[str]:
    """Keys whose values differ between a saved config dict and `current`, except those a
    resumed run may change."""
    mutable = resume_mutable()
    old, new = _flat(saved), _flat(config_to_dict(current))
    diffs = []
    for key in sorted(set(old) | set(new)):
        if any(key == m or (m.endswith(".") and key.startswith(m)) for m in mutable):
            continue
        if old.get(key, "<absent>") != new.get(key, "<absent>"):
            diffs.append(f"{key}: {old.get(key, '<absent>')!r} -> {new.get(key, '<absent>')!r}")
    return diffs


def check_resumable(saved: Mapping[str, Any], current: TrainConfig, where: str) -> None:
    """Raise `ConfigError` when a run dir's saved config differs where it must not."""
    diffs = config_differences(saved, current)
    if diffs:
        shown = "; ".join(diffs[:4]) + (f"; and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        raise ConfigError(
            f"{where} holds a run with another config ({shown}): use a new --run-dir, or the "
            "saved config (--config RUN_DIR/config.json)"
        )
