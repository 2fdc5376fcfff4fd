"""torch.export rewriting of hand-written KernelBench-style modules."""

from __future__ import annotations

import ast
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from synth.kernelbench.check import check_program
from synth.kernelbench.export import ExportResult, export_model, export_source
from synth.teacher.parse import parse_program


def _run_rewrite(result: ExportResult, model: nn.Module, inputs: list[torch.Tensor]) -> list[Any]:
    """The rewritten program on `inputs` and the Model's own weights, fed independently of
    the checker: each parameter input by its recorded name, in its get_inputs shape."""
    namespace: dict[str, Any] = {}
    exec(result.source, namespace)  # noqa: S102 - the rewrite under test
    shapes = [t.shape for t in namespace["get_inputs"]()]
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    args = list(inputs)
    for index in range(len(inputs), len(shapes)):
        target = result.param_inputs[f"tensor_{index}"]
        args.append(state[target].detach().reshape(shapes[index]))
    with torch.no_grad():
        return list(namespace["fused_operator"](*args))


def _assert_equal_to_model(result: ExportResult, model: nn.Module, inputs: list[torch.Tensor]):
    assert result.ok, result.reason
    with torch.no_grad():
        want = model(*inputs)
    want = list(want) if isinstance(want, tuple | list) else [want]
    got = _run_rewrite(result, model, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def _fused_lines(source: str) -> list[str]:
    module = ast.parse(source)
    func = next(
        n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "fused_operator"
    )
    return [ast.unparse(stmt) for stmt in func.body]


class LinearGelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(24, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x))


class ConvBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class ConvGroupNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3)
        self.norm = nn.GroupNorm(2, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def _export(model: nn.Module, *shapes: tuple[int, ...]) -> tuple[ExportResult, list[torch.Tensor]]:
    torch.manual_seed(0)
    result = export_model(type(model).__name__, model, lambda: [torch.randn(s) for s in shapes])
    torch.manual_seed(123)
    return result, [torch.randn(s) for s in shapes]


def test_linear_activation_becomes_transpose_matmul_add_gelu() -> None:
    model = LinearGelu()
    result, inputs = _export(model, (6, 24))
    _assert_equal_to_model(result, model, inputs)
    assert list(result.ops) == ["transpose", "matmul", "add", "gelu"]
    assert result.unmapped_ops == ()
    assert result.param_inputs == {"tensor_1": "fc.weight", "tensor_2": "fc.bias"}
    parse_program(result.source)  # the teacher's reader takes it whole


def test_conv_norm_keeps_parameters_as_inputs_in_broadcast_shape() -> None:
    model = ConvBatchNorm()
    result, inputs = _export(model, (2, 3, 10, 10))
    _assert_equal_to_model(result, model, inputs)
    assert list(result.ops) == ["conv2d", "add", "batch_norm", "mul", "add", "relu"]
    assert set(result.param_inputs.values()) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias"}
    assert "torch.randn([8, 1, 1], dtype=torch.float32)" in result.source
    assert "running" not in " ".join(result.param_inputs.values())  # statistics are not inputs
    parse_program(result.source)


def test_conv_group_norm_equal_to_model() -> None:
    model = ConvGroupNorm()
    result, inputs = _export(model, (2, 4, 9, 9))
    _assert_equal_to_model(result, model, inputs)
    assert "group_norm" in result.ops and result.unmapped_ops == ()


def test_residual_block_equal_to_model() -> None:
    model = ResidualBlock()
    result, inputs = _export(model, (2, 8, 8, 8))
    _assert_equal_to_model(result, model, inputs)
    assert result.ops.count("conv2d") == 2 and result.ops.count("batch_norm") == 2
    assert result.ops[-2:] == ("add", "relu")
    parse_program(result.source)


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
            return x * 2
        return x


def test_export_failure_is_reported_with_reason() -> None:
    result, _ = _export(Branchy(), (4, 4))
    assert not result.ok and result.source is None
    assert result.reason is not None and "torch.export failed" in result.reason
    record = result.to_record()
    assert record["ok"] is False and record["reason"] == result.reason


class Dropout(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, p=0.5, training=True)


def test_random_operator_is_a_reason() -> None:
    result, _ = _export(Dropout(), (4, 4))
    assert not result.ok and "random" in (result.reason or "")


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)


def test_integer_inputs_are_refused_with_reason() -> None:
    model = Embed()
    result = export_model("embed", model, lambda: [torch.randint(0, 10, (3,))])
    assert not result.ok and "torch.randn" in (result.reason or "")


class Mixed(nn.Module):
    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [
            F.leaky_relu(x, 0.2),
            torch.logsumexp(x, dim=1),
            x.mean(dim=[1, 2]),
            torch.cat([x, x, x], dim=2),
        ]


def test_non_registry_ops_stay_pytorch_and_params_are_spelled() -> None:
    model = Mixed()
    result, inputs = _export(model, (2, 3, 5))
    _assert_equal_to_model(result, model, inputs)
    lines = _fused_lines(result.source)
    assert "tensor_1 = F.leaky_relu(tensor_0, negative_slope=0.2)" in lines
    assert result.unmapped_ops == ("aten.logsumexp",)
    assert any(line.startswith("tensor_2 = torch.logsumexp(tensor_0") for line in lines)
    assert result.ops.count("mean") == 2 and result.ops.count("cat") == 2


def test_mismatch_is_reported_by_the_check() -> None:
    """A program that shifts before it scales: equal on a norm's initial weights (ones
    and zeros), caught on the randomly redrawn ones."""
    model = nn.LayerNorm(6)

    def swapped(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> list[torch.Tensor]:
        return [(F.layer_norm(x, [6]) + bias) * weight]

    def own_inputs() -> list[torch.Tensor]:
        return [torch.randn(3, 6), torch.randn(6), torch.randn(6)]

    feeds = [("weight", None), ("bias", None)]
    why = check_program(swapped, own_inputs, model, lambda: [torch.randn(3, 6)], feeds)
    assert why is not None and "random weights" in why

    def right(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> list[torch.Tensor]:
        return [F.layer_norm(x, [6]) * weight + bias]

    assert check_program(right, own_inputs, model, lambda: [torch.randn(3, 6)], feeds) is None


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("def get_inputs():\n    return []\n", "does not define `Model`"),
        ("this is not python", "cannot import"),
        (
            "import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n"
            "        raise ValueError('no')\ndef get_inputs():\n    return []\n",
            "Model(*get_init_inputs()) fails",
        ),
    ],
)
def test_broken_problem_files_are_reported(source: str, reason: str) -> None:
    result = export_source(source, "broken", level=1)
    assert not result.ok and reason in (result.reason or "")


class ScalarOperands(nn.Module):
    """Python numbers beside tensors, in each position and spelling PyTorch allows."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [
            x * 0.5,
            0.25 * x,
            x + 1,
            2.0 - x,
            torch.sub(-1.5, y),
            x / 3,
            3.0 / x,
            torch.add(x, y, alpha=-2),
        ]


def test_python_number_operands_are_registry_operators() -> None:
    """`2.0 - x` traces to rsub and `3.0 / x` to reciprocal: both come back as the
    registry's sub / div with the number first, so no line stays PyTorch."""
    model = ScalarOperands()
    result, inputs = _export(model, (3, 4), (4,))
    _assert_equal_to_model(result, model, inputs)
    assert result.unmapped_ops == ()
    lines = _fused_lines(result.source)
    for line in (
        "tensor_2 = torch.mul(tensor_0, 0.5)",
        "tensor_5 = torch.sub(2.0, tensor_0)",
        "tensor_6 = torch.sub(-1.5, tensor_1)",
        "tensor_8 = torch.div(1.0, tensor_0)",
        "tensor_10 = torch.add(tensor_0, tensor_1, alpha=-2)",
    ):
        assert line in lines, "\n".join(lines)
    program = parse_program(result.source)  # the teacher reads every line
    assert [op.kind for op in program.ops].count("div") == 2
