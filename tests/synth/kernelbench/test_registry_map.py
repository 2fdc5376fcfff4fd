"""ATen operators onto the registry's operators: the `aten` names, canonical lines, and
every operator the generator prints coming back as itself through torch.export."""

from __future__ import annotations

import pytest
import torch

from synth.generate import generate_programs
from synth.kernelbench.export import export_source
from synth.kernelbench.registry import canonical, operator_for, spelled
from synth.operators import REGISTRY

WRAP = (
    "\n\nclass Model(torch.nn.Module):\n"
    "    def forward(self, *tensors):\n"
    "        return fused_operator(*tensors)\n"
)


def test_aten_names_are_real_aten_operators_and_unique() -> None:
    seen: dict[str, str] = {}
    for name, op in REGISTRY.items():
        for alias in op.aten:
            assert hasattr(torch.ops.aten, alias), f"{name}: aten.{alias} does not exist"
            assert alias not in REGISTRY and alias not in seen, alias
            seen[alias] = name
    assert operator_for("amax") is REGISTRY["max"]
    assert operator_for("linalg_vector_norm") is REGISTRY["norm"]
    assert operator_for("relu") is REGISTRY["relu"]
    assert operator_for("logsumexp") is None


def test_canonical_only_when_the_rendering_states_the_parameters() -> None:
    leaky = REGISTRY["leaky_relu"]
    shape = [(4, 5)]
    assert canonical(leaky, ["x"], shape, {"negative_slope": 0.01}) == (
        "F.leaky_relu(x, negative_slope=0.01)"
    )
    assert canonical(leaky, ["x"], shape, {"negative_slope": 0.2}) is None
    assert spelled(leaky, ["x"], {"negative_slope": 0.2}) == "F.leaky_relu(x, negative_slope=0.2)"
    transpose = REGISTRY["transpose"]
    assert canonical(transpose, ["x"], [(2, 3, 4)], {"dim0": 1, "dim1": 2}) == (
        "torch.transpose(x, -2, -1)"
    )
    assert canonical(transpose, ["x"], [(2, 3, 4)], {"dim0": 0, "dim1": 1}) is None


def test_window_parameters_in_one_form() -> None:
    pool = REGISTRY["max_pool2d"]
    params = {"kernel_size": [3, 3], "stride": [], "padding": [1, 1], "dilation": [1, 1]}
    assert canonical(pool, ["x"], [(1, 2, 8, 8)], params) == (
        "F.max_pool2d(x, kernel_size=3, stride=3, padding=1, dilation=1)"
    )
    uneven = {**params, "stride": [1, 2]}  # kept as a list: PyTorch takes one per dim
    assert "stride=[1, 2]" in (canonical(pool, ["x"], [(1, 2, 8, 8)], uneven) or "")


def _round_trip(name: str) -> None:
    record = next(generate_programs(1, 1, 0, "tiny", [name]))
    result = export_source(record.source + WRAP, name, level=1)
    assert result.ok, result.reason
    assert list(result.ops) == [name], result.source
    assert result.unmapped_ops == ()


@pytest.mark.parametrize(
    "name", ["relu", "softsign", "argmax", "batch_norm", "conv2d", "max_pool2d", "cat"]
)
def test_generated_programs_come_back_as_their_operator(name: str) -> None:
    """The generator's canonical line for an operator, wrapped as a Model and exported,
    is rewritten as that same operator (softsign traces as abs/add/div, argmax(...).float()
    as argmax and a cast, batch_norm's inline statistics as zeros/ones)."""
    _round_trip(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registry_operator_round_trips(name: str) -> None:
    _round_trip(name)
