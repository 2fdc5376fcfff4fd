"""A run directory: its config, its checkpoints, its metrics, and whether it resumes.

    RUN_DIR/
      config.json        the full config of the run (written at start; checked on resume)
      checkpoints/<step>/{state,meta}   orbax (see `checkpoint`)
      metrics.jsonl      one JSON object per logged step (see `metrics`)
      tensorboard/       event files
      tokenizer/         the run's BPE, when `model.tokenizer = "bpe"`
      model/             the final parameters as a model directory (`drtriton sample --model`)
      curves.png         `drtriton train plot RUN_DIR`

Starting a run on a directory that already has checkpoints resumes from the newest one,
provided the saved config matches (`config.check_resumable`); otherwise a `ConfigError`
says which keys differ, before anything is computed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from learner.train.checkpoint import Checkpointer
from learner.train.config import (
    ConfigError,
    TrainConfig,
    check_resumable,
    config_from_dict,
    config_to_dict,
)

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
MODEL_DIR = "model"


def config_hash(cfg: TrainConfig) -> str:
    """A short hash of the config as saved (for checkpoint metadata)."""
    text = json.dumps(config_to_dict(cfg), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


@dataclass
class RunDir:
    path: Path
    cfg: TrainConfig
    kind: str  # "sft" or "rl"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def model_dir(self) -> Path:
        return self.path / MODEL_DIR

    def checkpointer(self) -> Checkpointer:
        c = self.cfg.checkpoint
        return Checkpointer(
            self.checkpoint_dir, keep=c.keep, every=c.every, async_save=c.async_save
        )

    def has_checkpoints(self) -> bool:
        """Whether a complete checkpoint exists (cheap: no orbax, no jax)."""
        if not self.checkpoint_dir.is_dir():
            return False
        return any(
            p.name.isdigit() and (p / "meta").is_dir() for p in self.checkpoint_dir.iterdir()
        )

    def saved_config(self) -> dict[str, Any] | None:
        path = self.path / CONFIG_FILE
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a config")
        return data

    def check(self) -> bool:
        """Before any compute: True when the run resumes (and its config matches)."""
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"run_dir {self.path} is a file")
        resumes = self.has_checkpoints()
        if resumes:
            saved = self.saved_config()
            if saved is None:
                raise ConfigError(f"{self.path} has checkpoints but no {CONFIG_FILE}")
            check_resumable(saved, self.cfg, str(self.path))
        return resumes

    def check_meta(self, meta: dict[str, Any]) -> None:
        """A checkpoint's metadata must come from a run of this kind."""
        if meta.get("kind", self.kind) != self.kind:
            raise ConfigError(
                f"{self.checkpoint_dir} holds a {meta.get('kind')} run, not a {self.kind} run"
            )

    def write_config(self) -> None:
        """RUN_DIR/config.json (process 0), loadable with `--config RUN_DIR/config.json`."""
        if jax.process_index() != 0:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path / CONFIG_FILE, config_to_dict(self.cfg))


def open_run_dir(cfg: TrainConfig, kind: str) -> RunDir:
    return RunDir(Path(cfg.run_dir), cfg, kind)


def load_saved_config(run_dir: Path | str) -> TrainConfig:
    """The config a run directory was started with."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    return config_from_dict(json.loads(path.read_text()))
