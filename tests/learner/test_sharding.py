"""Partition specs, and an 8-device CPU mesh giving the single-device results."""

from __future__ import annotations

from pathlib import Path

import pytest
from jax.sharding import PartitionSpec as P

import learner.sharding as sharding
from learner.model import io as model_io
from tests.learner.eight_devices import run_on_eight_devices

from .conftest import random_tiny_model


def test_fit_spec_drops_axes_that_do_not_divide() -> None:
    sizes = {"fsdp": 4, "tp": 4}
    assert sharding.fit_spec((896, 2, 64), ("fsdp", "tp", None), sizes) == P("fsdp", None, None)
    assert sharding.fit_spec((896, 16, 64), ("fsdp", "tp", None), sizes) == P("fsdp", "tp", None)
    assert sharding.fit_spec((6, 8), ("fsdp", "tp"), {"fsdp": 1, "tp": 2}) == P(None, "tp")
    with pytest.raises(ValueError):
        sharding.fit_spec((4,), ("fsdp", "tp"), sizes)


def test_eight_device_mesh_matches_single_device(tmp_path: Path) -> None:
    model_io.save_model(random_tiny_model(), tmp_path / "model")
    hf_dir = tmp_path / "hf"
    model_io.export_hf(tmp_path / "model", hf_dir)
    report = run_on_eight_devices(
        "tests.learner.mesh_worker", str(tmp_path / "model"), str(hf_dir), timeout=300
    )
    assert report["devices"] == 8
    for key in ("4x2", "2x4"):
        assert report[f"logits_diff_{key}"] < 1e-4, report
    assert report["q_spec_4x2"] == str(P("fsdp", "tp", None))
    assert report["q_shards_4x2"] == 8  # really split over all eight devices
    assert report["k_spec_2x4"] == str(P("fsdp", None, None))  # 2 KV heads cannot split 4 ways
    assert report["sample_equal_4x2"] is True and report["sample_equal_2x4"] is True
    # fused decode weights: KV heads over tp where tp divides them, the MLP's inner dim always
    assert report["qkv_spec_4x2"] == str(P("tp", None, None, "fsdp"))
    assert report["qkv_spec_2x4"] == str(P(None, None, None, "fsdp"))
    assert report["gate_up_spec_2x4"] == str(P(None, "tp", "fsdp"))
    assert report["hf_load_diff"] == 0.0
    assert report["hf_embed_spec"] == str(P("tp", "fsdp"))
