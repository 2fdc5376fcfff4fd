"""A sharded SFT step (8 CPU devices, fsdp x tp = 4 x 2) equals the single-device step."""

from __future__ import annotations

from tests.learner.eight_devices import run_on_eight_devices


def test_sharded_sft_step_equals_single_device_step() -> None:
    report = run_on_eight_devices("tests.learner.train.mesh_worker", "sharded-step")
    assert report["devices"] == 8
    assert report["q_spec"] == "P('fsdp', 'tp', None)" and report["q_shards"] == 8
    assert abs(report["loss"] - report["ref_loss"]) <= 1e-6 * abs(report["ref_loss"])
    assert abs(report["grad_norm"] - report["ref_grad_norm"]) <= 1e-5 * report["ref_grad_norm"]
    # Adam's first step moves each weight by about lr = 1e-3 (lr * g / (|g| + eps)); summing
    # in another order changes the last bits of g, which only a gradient that nearly cancels
    # can turn into more than 1% of a step.
    assert report["max_update"] > 5e-4
    assert report["max_param_diff"] < 1e-5
