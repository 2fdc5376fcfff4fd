"""Multi-operator programs: fused where the rules allow, always correct."""

from __future__ import annotations

import re

import pytest

from synth.teacher import translate
from synth.teacher.check import check_candidate

from .programs import random_program, render
from .util import assert_correct, generated_programs

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

BN = "F.batch_norm({0}, torch.zeros(3, device={0}.device), torch.ones(3, device={0}.device), training=True)"

# (inputs, calls, expected kernels): each shows one fusion rule.
FUSED = {
    "elementwise chain with broadcasts": (
        [[4, 1, 8], [3, 8], [8]],
        ["torch.add({0}, {1})", "torch.mul({3}, {2})", "torch.sigmoid({4})", "F.gelu({5})"],
        1,
    ),
    "horizontal: independent inputs of one shape": (
        [[4, 8], [4, 8]],
        ["torch.relu({0})", "torch.tanh({1})", "torch.sub({2}, {3})"],
        1,
    ),
    "matmul epilogue": (
        [[8, 16], [16, 12], [12]],
        ["torch.matmul({0}, {1})", "torch.add({3}, {2})", "torch.relu({4})"],
        1,
    ),
    "bmm epilogue reading a transposed input": (
        [[2, 8, 5], [2, 5, 6], [2, 6, 8]],
        ["torch.bmm({0}, {1})", "torch.transpose({2}, -2, -1)", "torch.maximum({3}, {4})"],
        1,
    ),
    "transposed operand folded into matmul": (
        [[5, 8], [5, 6]],
        ["torch.transpose({0}, -2, -1)", "torch.matmul({2}, {1})"],
        1,
    ),
    "reduction epilogue, keepdim": (
        [[6, 9], [6, 1]],
        ["torch.mean({0}, dim=1, keepdim=True)", "torch.div({2}, {1})"],
        1,
    ),
    "argmax epilogue": (
        [[5, 7, 3]],
        ["torch.argmax({0}, dim=1, keepdim=False).float()", "F.softsign({1})"],
        1,
    ),
    "softmax epilogue": (
        [[4, 10], [4, 10]],
        ["torch.softmax({0}, dim=1)", "torch.mul({2}, {1})"],
        1,
    ),
    "log_softmax over a leading dim": (
        [[7, 3, 4]],
        ["torch.log_softmax({0}, dim=0)", "torch.abs({1})"],
        1,
    ),
    "layer_norm epilogue": (
        [[3, 4, 5]],
        ["F.layer_norm({0}, normalized_shape=[4, 5])", "F.silu({1})"],
        1,
    ),
    "batch_norm epilogue": ([[2, 3, 4, 4]], [BN, "F.elu({1}, alpha=1.0)"], 1),
    "scan epilogue": ([[3, 9]], ["torch.cumsum({0}, dim=1)", "torch.sin({1})"], 1),
    "conv epilogue": (
        [[1, 4, 6, 6], [4, 2, 3, 3], [4, 1, 1]],
        [
            "F.conv2d({0}, {1}, stride=1, padding=1, dilation=1, groups=2)",
            "torch.add({3}, {2})",
            "torch.relu({4})",
        ],
        1,
    ),
    "pool epilogue": (
        [[2, 2, 6, 6]],
        ["F.max_pool2d({0}, kernel_size=2, stride=2, padding=0, dilation=1)", "torch.tanh({1})"],
        1,
    ),
    "cat then elementwise": (
        [[2, 3], [4, 3]],
        ["torch.cat([{0}, {1}], dim=0)", "torch.relu({2})", "torch.tril({3})"],
        1,
    ),
    "stored intermediate and output": (
        [[4, 6]],
        ["torch.relu({0})", "torch.exp2({1})", "torch.add({1}, {2})"],
        1,
    ),
    "reduction then broadcast back: two kernels": (
        [[6, 9]],
        ["torch.max({0}, dim=1, keepdim=True).values", "torch.sub({0}, {1})"],
        2,
    ),
    "prologue: elementwise chain into a reduction": (
        [[6, 9], [9]],
        ["torch.mul({0}, {1})", "torch.sigmoid({2})", "torch.var({3}, dim=0, keepdim=False)"],
        1,
    ),
    "prologue into softmax, with an epilogue": (
        [[5, 7]],
        ["torch.abs({0})", "torch.softmax({1}, dim=1)", "torch.relu({2})"],
        1,
    ),
    "prologue into pooling (padding stays neutral)": (
        [[2, 2, 6, 6]],
        ["torch.sigmoid({0})", "F.avg_pool2d({1}, kernel_size=3, stride=2, padding=1)"],
        1,
    ),
    "prologue into a norm over a transposed input": (
        [[3, 4, 5]],
        ["torch.transpose({0}, -2, -1)", "F.layer_norm({1}, normalized_shape=[5, 4])"],
        1,
    ),
    "prologues into both matmul operands": (
        [[2, 12, 20], [20], [2, 20, 9]],
        ["torch.add({0}, {1})", "F.gelu({3})", "torch.sigmoid({2})", "torch.bmm({4}, {5})"],
        1,
    ),
    "prologue into a convolution": (
        [[1, 4, 7], [4, 2, 3]],
        ["torch.tanh({0})", "F.conv1d({2}, {1}, stride=1, padding=1, dilation=1, groups=2)"],
        1,
    ),
    "no prologue when the producer has other outputs": (
        [[6, 9]],
        ["torch.abs({0})", "torch.sum({1}, dim=0, keepdim=False)", "torch.add({1}, {1})"],
        2,
    ),
    "no prologue for a broadcast matmul batch": (
        [[12, 20], [2, 20, 9]],
        ["torch.relu({0})", "torch.matmul({2}, {1})"],
        2,
    ),
    "transposed input of a reduction is read through its strides": (
        [[4, 6]],
        ["torch.transpose({0}, -2, -1)", "torch.var({1}, dim=1, keepdim=False)"],
        1,
    ),
    "double transpose returned": (
        [[3, 5]],
        ["torch.transpose({0}, -2, -1)", "torch.transpose({1}, -2, -1)"],
        1,
    ),
}


@pytest.mark.parametrize("name", list(FUSED))
def test_fusion_rules(name: str) -> None:
    inputs, calls, kernels = FUSED[name]
    translation = assert_correct(render(inputs, calls))
    assert len(translation.kernels) == kernels  # fused groups (a norm's moments kernel aside)


@pytest.mark.parametrize(("level", "seed"), [(2, s) for s in range(8)] + [(5, s) for s in range(8)])
def test_random_builder_programs(level: int, seed: int) -> None:
    assert_correct(random_program(level, seed), seeds=(0,))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8, 40))
def test_random_builder_programs_more(seed: int) -> None:
    assert_correct(random_program(5 if seed % 2 else 10, seed), seeds=(0,))


@pytest.mark.parametrize("level", [2, 5])
def test_generated_programs(level: int) -> None:
    programs = generated_programs(level, 4, seed=11, pool=12)
    if programs is None:
        programs = [random_program(level, 100 + i) for i in range(4)]
    assert programs
    for source in programs:
        assert_correct(source, seeds=(0,))


@pytest.mark.slow
@pytest.mark.parametrize("level", [2, 5, 10])
def test_generated_programs_more(level: int) -> None:
    programs = generated_programs(level, 16, seed=23, pool=40, max_flops=2**17)
    if programs is None:
        pytest.skip("the synth generator is not importable")
    for source in programs:
        assert_correct(source, seeds=(0,))


def test_candidates_never_compute_with_torch() -> None:
    """The checker's guard is real: a candidate that calls torch.relu fails it."""
    source = render([[4, 8]], ["torch.relu({0})"])
    cheat = (
        "import torch\nimport triton\n\n\ndef triton_fused_operator(tensor_0):\n"
        "    return [torch.relu(tensor_0)]\n"
    )
    result = check_candidate(source, cheat)
    assert not result.correct and "aten.relu" in result.message
    assert check_candidate(source, translate(source).code).correct


def test_emitted_module_uses_only_allowed_torch_calls() -> None:
    """The host code allocates, takes views and reads metadata, nothing else."""
    calls = [
        "torch.matmul({0}, {1})",
        "torch.transpose({2}, -2, -1)",
        "torch.softmax({3}, dim=0)",
        "torch.cummax({4}, dim=1).values",
    ]
    code = translate(render([[6, 5], [5, 6]], calls)).code
    host = code[code.index("def triton_fused_operator") :]
    used = set(re.findall(r"torch\.(\w+)", host)) | set(re.findall(r"\.(\w+)\(", host))
    allowed = {
        "empty",
        "broadcast_shapes",
        "float32",
        "contiguous",
        "expand",
        "stride",
        "numel",
        "transpose",
    }
    allowed |= {"cdiv", "next_power_of_2", "prod"}
    assert used - allowed <= {k for k in used if k.endswith("_kernel")}
