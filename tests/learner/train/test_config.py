"""Training config: presets, typed overrides, unknown keys, JSON round trip, resume checks,
and the 7b-cluster preset's shapes and shardings on a forced 8-device CPU mesh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learner.train.config import (
    PRESETS,
    ConfigError,
    TrainConfig,
    check_resumable,
    config_from_dict,
    config_to_dict,
    load_config,
)
from tests.learner.eight_devices import run_on_eight_devices


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_load_and_round_trip_through_json(name: str) -> None:
    cfg = load_config(name)
    assert isinstance(cfg, TrainConfig)
    again = config_from_dict(json.loads(json.dumps(config_to_dict(cfg))))
    assert again == cfg


def test_presets_say_what_they_promise() -> None:
    tiny, gpu, big = (load_config(n) for n in ("tiny-cpu", "100m-gpu", "7b-cluster"))
    assert tiny.model.tokenizer == "bpe" and tiny.model.num_layers <= 2
    assert gpu.model.compute_dtype == "auto" and gpu.model.param_dtype == "float32"
    assert big.model.path and big.model.num_layers == 28 and big.mesh.tp > 1
    assert tiny.rl.group_size == 4  # the RL module's additions for the preset are merged


def test_overrides_are_typed_by_their_field() -> None:
    cfg = load_config(
        "tiny-cpu",
        [
            "optim.lr=1e-2",
            "optim.total_steps=7",
            "model.remat=yes",
            "data.pairs=a.jsonl,b.jsonl",
            "data.levels=1,2",
            "sandbox.servers=h1:5,h2:6",
            "seed=3",
            "rl.levels=2",
        ],
    )
    assert cfg.optim.lr == 0.01 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.total_steps == 7 and cfg.model.remat is True and cfg.seed == 3
    assert cfg.data.pairs == ("a.jsonl", "b.jsonl") and cfg.data.levels == (1, 2)
    assert cfg.sandbox.servers == ("h1:5", "h2:6") and cfg.rl.levels == (2,)
    assert load_config("tiny-cpu", ["data.levels="]).data.levels == ()


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("optim.lrr=1", ["optim.lrr", "optim.lr", "optim.grad_accum"]),
        ("nosuch.key=1", ["nosuch.key", "model", "optim", "rl"]),
        ("optim=3", ["section", "optim.lr"]),
        ("optim.lr=fast", ["optim.lr", "float"]),
        ("model.remat=maybe", ["model.remat", "bool"]),
        ("optim.total_steps=0", ["optim.total_steps"]),
        ("rl.algorithm=ppo", ["rl.algorithm"]),
        ("no_equals_sign", ["section.key=value"]),
    ],
)
def test_bad_overrides_are_one_clear_error(override: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("tiny-cpu", [override])
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ConfigError, match="tiny-cpu"):
        load_config("tiny")


def test_config_files_json_and_toml(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('preset = "tiny-cpu"\n[optim]\nlr = 0.5\n[data]\npairs = ["x.jsonl"]\n')
    cfg = load_config(str(toml), ["optim.warmup_steps=3"])
    assert cfg.optim.lr == 0.5 and cfg.data.pairs == ("x.jsonl",) and cfg.optim.warmup_steps == 3
    assert cfg.model.hidden_size == PRESETS["tiny-cpu"]["model"]["hidden_size"]
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(config_to_dict(cfg)))
    assert load_config(str(saved)) == cfg
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"optim": {"lr": "fast"}}))
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(str(tmp_path / "missing.json"))


def test_resume_allows_only_trajectory_neutral_changes() -> None:
    cfg = load_config("tiny-cpu")
    saved = config_to_dict(cfg)
    fine = load_config(
        "tiny-cpu", ["optim.total_steps=999", "eval.every=3", "run_dir=elsewhere", "log.every=1"]
    )
    check_resumable(saved, fine, "RUN")
    with pytest.raises(ConfigError) as info:
        check_resumable(saved, load_config("tiny-cpu", ["optim.lr=0.5", "data.seed=4"]), "RUN")
    assert "optim.lr" in str(info.value) and "data.seed" in str(info.value)


def test_7b_cluster_shapes_and_shardings_on_8_cpu_devices() -> None:
    """Abstract arrays only: the 7B state and step traced on a 2 x 4 mesh, never run."""
    report = run_on_eight_devices("tests.learner.train.mesh_worker", "abstract-7b", timeout=300)
    assert report["mesh"] == {"fsdp": 2, "tp": 4}
    assert 7.6e9 < report["params"] < 7.7e9  # Qwen2.5-7B
    shapes, specs = report["shapes"], report["specs"]
    assert shapes["embedder.embedding"] == [152064, 3584]
    assert shapes["lm_head.kernel"] == [3584, 152064]
    assert shapes["layers.0.attn.q_proj.kernel"] == [3584, 28, 128]
    assert shapes["layers.0.attn.k_proj.kernel"] == [3584, 4, 128]
    assert shapes["layers.0.mlp.down_proj.kernel"] == [18944, 3584]
    assert specs["layers.27.attn.q_proj.kernel"] == "P('fsdp', 'tp', None)"
    assert specs["layers.0.attn.k_proj.kernel"] == "P('fsdp', 'tp', None)"  # 4 KV heads / tp 4
    assert specs["layers.0.mlp.down_proj.kernel"] == "P('tp', 'fsdp')"
    assert specs["lm_head.kernel"] == "P('fsdp', 'tp')"
    assert report["mu_q_spec"] == "P('fsdp', 'tp', None)"  # Adam moments follow their params
    # Parameters and both moments in float32, split 8 ways: the whole state over 8 devices.
    assert report["state_bytes_total"] > 12 * 7.6e9
    assert report["state_bytes_per_device"] < report["state_bytes_total"] / 8 * 1.01
    assert report["step_keeps_structure"] is True
    assert {"loss", "lr", "grad_norm"} <= set(report["step_out"])
