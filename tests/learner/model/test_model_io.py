"""HF safetensors import/export: exact round trips and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from learner.model import io as model_io
from learner.model import qwen2
from learner.model import safetensors_io as st

from ..conftest import write_hf_checkpoint


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    reader = st.TensorReader()
    return {name: np.array(reader.get(info)) for name, info in st.index_dir(directory).items()}


def _assert_bit_exact(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize("fixture", ["hf_tied", "hf_untied"])
def test_import_export_round_trip_is_bit_exact(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    hf_dir: Path = request.getfixturevalue(fixture)
    model_io.import_hf(hf_dir, tmp_path / "model")
    meta = json.loads((tmp_path / "model" / model_io.FORMAT_FILE).read_text())
    assert meta["param_dtype"] == "float32"
    assert (tmp_path / "model" / "generation_config.json").is_file()
    model_io.export_hf(tmp_path / "model", tmp_path / "hf")
    _assert_bit_exact(_tensors(hf_dir), _tensors(tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == json.loads(
        (hf_dir / "config.json").read_text()
    )


def test_sharded_bfloat16_checkpoint_round_trips(tmp_path: Path) -> None:
    src = write_hf_checkpoint(tmp_path / "src", tied=True, dtype="bfloat16", max_shard_size="40KB")
    assert (src / st.INDEX_FILE).is_file()
    original = _tensors(src)
    assert {a.dtype for a in original.values()} == {np.dtype(ml_dtypes.bfloat16)}

    model, _ = model_io.load_hf(src)
    assert model.config.param_dtype == "bfloat16"
    model_io.import_hf(src, tmp_path / "model")
    files = model_io.export_hf(tmp_path / "model", tmp_path / "out", max_shard_bytes=50_000)
    assert len(files) > 1 and (tmp_path / "out" / st.INDEX_FILE).is_file()
    _assert_bit_exact(original, _tensors(tmp_path / "out"))


def test_exported_checkpoint_loads_in_transformers(hf_untied: Path, tmp_path: Path) -> None:
    import torch
    from transformers import Qwen2ForCausalLM

    model_io.import_hf(hf_untied, tmp_path / "model")
    model_io.export_hf(tmp_path / "model", tmp_path / "hf")
    ref = Qwen2ForCausalLM.from_pretrained(hf_untied).state_dict()
    back = Qwen2ForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert all(torch.equal(ref[k], back[k]) for k in ref)


def test_tied_checkpoint_with_explicit_lm_head_keeps_it(hf_tied: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(hf_tied, src)
    tensors = _tensors(src)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    st.write_file(src / st.SINGLE_FILE, tensors, {"format": "pt"})
    model_io.import_hf(src, tmp_path / "model")
    model_io.export_hf(tmp_path / "model", tmp_path / "out")
    _assert_bit_exact(tensors, _tensors(tmp_path / "out"))

    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    st.write_file(src / st.SINGLE_FILE, tensors, {"format": "pt"})
    with pytest.raises(model_io.ModelFormatError, match="differs"):
        model_io.load_hf(src)


def _edited_copy(hf_dir: Path, dst: Path, edit) -> Path:
    shutil.copytree(hf_dir, dst)
    tensors = _tensors(dst)
    edit(tensors)
    st.write_file(dst / st.SINGLE_FILE, tensors, {"format": "pt"})
    return dst


def test_unknown_missing_and_misshapen_tensors_are_named(hf_untied: Path, tmp_path: Path) -> None:
    def add(t):
        t["model.layers.0.self_attn.q_norm.weight"] = np.ones(4, np.float32)

    def drop(t):
        del t["model.layers.1.mlp.up_proj.weight"]

    def reshape(t):
        t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"][
            :, :5
        ].copy()

    cases = [
        (add, "unknown tensors model.layers.0.self_attn.q_norm.weight"),
        (drop, "missing tensors model.layers.1.mlp.up_proj.weight"),
        (reshape, "down_proj.weight has shape"),
    ]
    for i, (edit, message) in enumerate(cases):
        with pytest.raises(model_io.ModelFormatError, match=message):
            model_io.load_hf(_edited_copy(hf_untied, tmp_path / str(i), edit))


def test_ignorable_and_unsupported_configs(hf_untied: Path, tmp_path: Path) -> None:
    def add_inv_freq(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)

    model_io.load_hf(_edited_copy(hf_untied, tmp_path / "inv", add_inv_freq))  # recomputed, skipped

    bad = tmp_path / "bad"
    shutil.copytree(hf_untied, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
    with pytest.raises(model_io.ModelFormatError, match="sliding"):
        model_io.load_hf(bad)
    with pytest.raises(model_io.ModelFormatError, match="no such directory"):
        model_io.load_hf(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(model_io.ModelFormatError, match="config.json not found"):
        model_io.load_hf(tmp_path / "empty")


def test_config_reads_hf_variants() -> None:
    base = dict(qwen2.PRESETS["qwen2.5-1.5b"])
    cfg = qwen2.Qwen2Config.from_hf(base)
    assert (cfg.head_dim, cfg.rope_theta, cfg.tie_word_embeddings) == (128, 1e6, True)
    v5 = {k: v for k, v in base.items() if k != "rope_theta"} | {
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}
    }
    assert qwen2.Qwen2Config.from_hf(v5).rope_theta == 5e5
    with pytest.raises(ValueError, match="yarn"):
        qwen2.Qwen2Config.from_hf(base | {"rope_scaling": {"type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="model_type"):
        qwen2.Qwen2Config.from_hf(base | {"model_type": "llama"})
    assert qwen2.Qwen2Config.from_hf(cfg.to_hf()) == cfg


def test_safetensors_writer_is_readable_by_the_reference_library(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.arange(5, dtype=np.int64),
        "c": np.zeros((0, 4), np.float16),
    }
    st.write_file(tmp_path / "x.safetensors", tensors, {"format": "pt"})
    back = load_file(tmp_path / "x.safetensors")
    assert all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())


def test_presets_have_the_published_parameter_counts() -> None:
    import math

    from bench import learner_bench

    published = {
        "qwen2.5-0.5b": 494_032_768,
        "qwen2.5-1.5b": 1_543_714_304,
        "qwen2.5-7b": 7_615_616_512,
    }
    for name, count in published.items():
        cfg = qwen2.Qwen2Config.from_hf(qwen2.PRESETS[name])
        shapes = model_io.flat_params(qwen2.abstract(cfg)).values()
        assert sum(math.prod(x.shape) for x in shapes) == count, name
    # The benchmark's own arithmetic (weight bytes for the bandwidth bound) agrees.
    for name in ("0.5b", "1.5b"):
        assert (
            learner_bench.shape_facts(learner_bench.MODELS[name])["params"]
            == published[f"qwen2.5-{name}"]
        )
