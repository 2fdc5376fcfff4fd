"""Python numbers as binary operands (`torch.mul(x, 0.5)`, `torch.sub(2.0, x)`).

The registry allows a number in either operand of add, sub, mul and div (and lerp's
weight); the teacher reads it as the float32 value PyTorch computes with and writes it
into the kernel as a literal, fused like any pointwise operator. Checked in process
against PyTorch, and through the sandbox with the bundled KernelBench problems that
need it, at small sizes.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import torch

from synth.teacher import TranslationError, translate
from synth.teacher.numbers import NumberError, float32_literal, float32_value
from synth.teacher.parse import parse_program

from .conftest import DEVICE
from .programs import render
from .util import assert_correct

if TYPE_CHECKING:
    from sandbox.api import LocalSandbox

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


# --------------------------------------------------------------------------- numbers


def _torch_float32(value: float | int) -> float:
    """The value PyTorch computes with when a float32 tensor meets the number."""
    return (torch.ones(1, dtype=torch.float32) * value).item()


def _sample_values() -> list[float | int]:
    rng = random.Random(5)
    values: list[float | int] = [0.1, 1 / 3, -0.0, 0.0, 2.0**-126, 3.4028234663852886e38, 0.125]
    values += [2**24 + 1, -(2**31), 7, 16777217.0, 1e-30, 123456.789]
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randint(-37, 38) for _ in range(300)]
    return values


def test_numbers_are_the_float32_values_pytorch_uses_and_their_literals_read_back() -> None:
    for value in _sample_values():
        rounded = float32_value(value)
        assert struct.unpack("f", struct.pack("f", rounded))[0] == rounded  # a float32 value
        assert rounded == _torch_float32(value), value
        text = float32_literal(rounded)
        assert any(c in text for c in ".e"), text  # Triton reads it as a float
        assert struct.unpack("f", struct.pack("f", float(text)))[0] == rounded, text
    assert float32_literal(float32_value(0.1)) == "0.1"  # the shortest text, not 0.100000001
    assert float32_literal(float32_value(3)) == "3.0"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "bool"),
        (1j, "complex"),
        (float("inf"), "not finite"),
        (float("nan"), "not finite"),
        (1e39, "beyond float32's range"),
        (1e-40, "not a normal float32"),
        (2**60, "too large"),
        ("0.5", "not a Python number"),
    ],
)
def test_numbers_a_float32_kernel_cannot_use_are_refused(value: object, message: str) -> None:
    with pytest.raises(NumberError, match=message):
        float32_value(value)


# --------------------------------------------------------------------------- parsing


def test_a_number_in_either_position_is_an_operand_not_a_tensor() -> None:
    source = render(
        [[3, 4], [4]],
        [
            "torch.sub(2.0, {0})",
            "torch.mul({2}, -3)",
            "torch.add(other={3}, input=0.5)",
            "torch.add({4}, {1}, alpha=-2)",
            "torch.div(1, {5})",
        ],
    )
    ops = parse_program(source).ops
    assert [(op.inputs, op.numbers) for op in ops] == [
        (("tensor_0",), {"input": 2.0}),
        (("tensor_2",), {"other": -3.0}),
        (("tensor_3",), {"input": 0.5}),
        (("tensor_4", "tensor_1"), {}),
        (("tensor_5",), {"input": 1.0}),
    ]
    assert ops[3].params["alpha"] == -2.0 and ops[0].params["alpha"] == 1.0
    assert ops[1].operands(["r"]) == ["r", "(-3.0)"]
    assert parse_program(source).shapes["tensor_6"] == (3, 4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("torch.add(1.0, 2.0)", "add: at least one operand must be a tensor"),
        (
            "torch.maximum({0}, 0.5)",
            r"maximum: `other` must be a tensor, not a Python number \(the scalar form is "
            r"torch.clamp\)",
        ),
        ("torch.minimum(0.5, {0})", "minimum: `input` must be a tensor"),
        ("torch.mul({0}, True)", "mul's `other`: True is a bool"),
        ("torch.mul({0}, 1j)", "complex"),
        ("torch.mul({0}, 1e39)", "beyond float32's range"),
        ("torch.mul({0}, float('inf'))", "must be a tensor name or a Python number"),
        ("torch.mul({0}, 'a')", "not a Python number"),
        ("torch.add({0}, {0}, alpha=True)", "alpha: True is a bool"),
    ],
)
def test_numbers_pytorch_or_a_float32_kernel_would_not_take_are_refused(
    call: str, message: str
) -> None:
    with pytest.raises(TranslationError, match=f"line 9: .*{message}"):
        parse_program(render([[4, 5]], [call]))


# --------------------------------------------------------------------------- kernels

FORMS = [
    "torch.add({0}, 1.0)",
    "torch.add(2, {0})",
    "torch.sub({0}, 0.75)",
    "torch.sub(2.0, {0})",
    "torch.sub(-1, {0}, alpha=0.5)",
    "torch.mul({0}, 0.5)",
    "torch.mul(-3, {0})",
    "torch.div({0}, 3)",
    "torch.div(-2.5, {0})",
    "torch.add({0}, -0.1, alpha=3)",
    "torch.lerp({0}, torch_ones, 0.3)",
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", [[5, 7], []])
def test_each_number_form_is_correct(form: str, shape: list[int]) -> None:
    if "torch_ones" in form:
        source = render([shape, shape], [form.replace("torch_ones", "{1}")])
    else:
        source = render([shape], [form])
    translation = assert_correct(source)
    assert translation.kernel_count == 1
    assert "_ptr" not in translation.code.split("(")[1].split(",")[-1]  # no pointer for it


def test_an_elementwise_chain_with_numbers_is_one_kernel() -> None:
    source = render(
        [[4, 3, 6], [3, 1]],
        [
            "torch.mul({0}, 0.5)",
            "torch.add(1.0, {2})",
            "torch.sub({3}, {1}, alpha=2)",
            "torch.div({4}, -3)",
            "torch.relu({5})",
            "torch.sub(1, {6})",
        ],
    )
    translation = assert_correct(source)
    assert translation.kernels == (("mul", "add", "sub", "div", "relu", "sub"),)
    assert "0.5" in translation.code and "(-3.0)" in translation.code


@pytest.mark.parametrize(
    ("inputs", "calls", "kernels"),
    [
        # a prologue computed at a reduction's loads
        (
            [[6, 9]],
            ["torch.sub(1.0, {0})", "torch.mul({1}, 2)", "torch.sum({2}, dim=1)"],
            (("sub", "mul", "sum"),),
        ),
        # an epilogue on a matmul tile, then softmax (attention's scale)
        (
            [[2, 5, 8], [2, 8, 5]],
            ["torch.matmul({0}, {1})", "torch.mul({2}, 0.125)", "torch.softmax({3}, dim=-1)"],
            (("matmul", "mul"), ("softmax",)),
        ),
        # prologue and epilogue around a window
        (
            [[2, 3, 12]],
            [
                "torch.mul(-2.0, {0})",
                "F.max_pool1d({1}, kernel_size=3, stride=2)",
                "torch.add({2}, 0.25)",
            ],
            (("mul", "max_pool1d", "add"),),
        ),
    ],
)
def test_numbers_fuse_into_anchors(
    inputs: list[list[int]], calls: list[str], kernels: tuple[tuple[str, ...], ...]
) -> None:
    translation = assert_correct(render(inputs, calls))
    assert translation.kernels == kernels


def test_number_kernels_compile_for_the_gpu_and_stay_float32() -> None:
    """The GPU compiler takes the literals (negative, tiny, huge), and none makes the
    arithmetic float64 (Triton types a literal that stands alone, as lerp's weight does,
    fp64 outside float32's normal range)."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    from synth.teacher.check import compile_for_gpu_isolated, ptx_for_gpu_isolated

    extremes = render(
        [[5, 7]],
        [
            "torch.mul({0}, 3.4028234663852886e38)",
            "torch.add(1.1754943508222875e-38, {1})",
            "torch.div({2}, -1e-30)",
            "torch.sub(-0.0, {3}, alpha=-7)",
            "torch.lerp({4}, {0}, 1e-30)",
        ],
    )
    sources = [render([[5, 7]], [form.replace("torch_ones", "{0}")]) for form in FORMS]
    pairs = [(source, translate(source).code) for source in [extremes, *sources]]
    assert compile_for_gpu_isolated(pairs) == [[] for _ in pairs]
    (ptx,) = ptx_for_gpu_isolated(*pairs[0])
    assert ".f64" not in ptx


# --------------------------------------------------------------------------- KernelBench

SMALL_KERNELBENCH = {
    "level2/attention_scores.py": {"batch_heads": 2, "seq_len": 16, "head_dim": 8},
    "level2/conv_transpose2d_clamp_scale.py": {
        "batch_size": 2,
        "in_channels": 4,
        "out_channels": 3,
        "height": 5,
        "width": 5,
    },
    "level2/gemm_scale_residual.py": {"batch_size": 8, "in_features": 16, "out_features": 12},
}
"""The bundled problems with a number operand (`y * scale`), at sizes the interpreter runs
in seconds."""


def _kernelbench_source(name: str) -> str:
    from synth.kernelbench.cli import BUNDLED
    from synth.kernelbench.export import export_problem

    result = export_problem(BUNDLED / name, overrides=SMALL_KERNELBENCH[name])
    assert result.ok, result.reason
    return result.source


@pytest.mark.parametrize("name", sorted(SMALL_KERNELBENCH))
def test_bundled_kernelbench_problems_with_numbers_are_correct(name: str) -> None:
    source = _kernelbench_source(name)
    translation = assert_correct(source)
    assert "mul" in translation.operators


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    api = pytest.importorskip("sandbox.api")
    from sandbox.config import SandboxConfig

    config = SandboxConfig(
        device=DEVICE,
        workers=2,
        allow_weak_isolation=os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1",
    )
    with api.LocalSandbox(config) as local:
        yield local


def test_number_operands_are_verified_by_the_sandbox(sandbox: LocalSandbox) -> None:
    """Every form fused in two chains, and the three KernelBench problems."""
    problems = {
        "chain": render(
            [[3, 1, 5], [4, 5]],
            [
                "torch.mul({0}, 0.5)",
                "torch.sub(2.0, {2})",
                "torch.add({3}, {1}, alpha=-1.5)",
                "torch.div(-3, {4})",
                "torch.lerp({5}, {1}, 0.25)",
                "torch.add(1, {6})",
                "torch.div({7}, 7)",
            ],
        ),
        "reduction": render(
            [[4, 6]], ["torch.sub({0}, -0.5)", "torch.mean({1}, dim=0)", "torch.mul(3, {2})"]
        ),
    }
    problems |= {name: _kernelbench_source(name) for name in SMALL_KERNELBENCH}
    failures = []
    for label, problem in problems.items():
        result = sandbox.verify(problem, translate(problem).code, timing=False, time_budget_s=600)
        if result.verdict != "correct":
            failures.append(f"{label}: {result.verdict}: {result.message[:300]}")
    assert not failures, "\n".join(failures)
