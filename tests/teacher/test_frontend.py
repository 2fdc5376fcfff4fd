"""The front end takes any straight-line program over the operators.

Names are free and may be reassigned; parameters may be positional or keywords.
Every value is renamed to `tensor_N` in order of definition, so such a program
translates to exactly the code of its canonical (generator-style) spelling.
"""

from __future__ import annotations

import pytest

from synth.teacher import TranslationError, translate
from synth.teacher.codegen import KernelBuilder
from synth.teacher.parse import parse_program

from .util import assert_correct

HEAD = "import torch\nimport torch.nn.functional as F\n\n"


def program(inputs: dict[str, list[int]], args: list[str], body: list[str], ret: str) -> str:
    made = "\n".join(f"    {n} = torch.randn({s}, dtype=torch.float32)" for n, s in inputs.items())
    lines = "\n".join(f"    {line}" for line in body)
    return (
        f"{HEAD}def get_inputs():\n{made}\n    return [{', '.join(inputs)}]\n\n"
        f"def fused_operator({', '.join(args)}):\n{lines}\n    return {ret}\n"
    )


# The issue's chain: a broadcast prologue, a dilated window, then tril. The epilogue's
# coordinates once used the prologue's sizes (a kernel argument clash): 47% wrong.
ISSUE_CHAIN = program(
    {"tensor_0": [60, 1, 1], "tensor_1": [57, 52]},
    ["tensor_0", "tensor_1"],
    [
        "tensor_2 = torch.sub(tensor_1, tensor_0)",
        "tensor_3 = F.max_pool1d(tensor_2, kernel_size=14, stride=1, padding=5, dilation=3)",
        "tensor_4 = torch.tril(tensor_3)",
    ],
    "[tensor_4]",
)


def test_issue_chain_sub_max_pool1d_tril() -> None:
    translation = assert_correct(ISSUE_CHAIN, seeds=(0,))
    assert len(translation.kernels) == 1


def test_prologue_and_epilogue_coordinates_of_different_shapes() -> None:
    """The same bug at tiny shapes, with a bias broadcast inside the epilogue too."""
    source = program(
        {"a": [6, 1, 1], "b": [5, 9], "c": [5, 1]},
        ["a", "b", "c"],
        [
            "t = torch.mul(b, a)",
            "t = F.max_pool1d(t, 3, 1, 1, 2)",
            "t = torch.triu(t, diagonal=-1)",
            "t = torch.add(t, c)",
        ],
        "[t]",
    )
    assert_correct(source, seeds=(0,))


def test_kernel_arguments_of_one_name_and_two_values_get_distinct_names() -> None:
    k = KernelBuilder("k", "doc")
    first = k.scalars(["size1", "size2"], "a_shape[1:]")
    second = k.scalars(["size1", "size2"], "b_shape[1:]")
    assert first == ["size1", "size2"] and second == ["size1_2", "size2_2"]
    assert k.scalars(["size1", "size2"], "b_shape[1:]") == second  # the same value: reused
    assert k.scalar("size2", "c") == "size2_3"  # a clash on any name, not the first only


FREE_NAMES = program(
    {"a": [60, 1, 1], "b": [57, 52]},
    ["x", "mask"],  # names the kernels use for their own variables
    [
        '"""A docstring is fine."""',
        "x = torch.sub(input=mask, other=x)",
        "x: torch.Tensor = F.max_pool1d(x, 14, 1, 5, 3)",
        "x = torch.tril(x)",
    ],
    "(x,)",
)


def test_reused_and_arbitrary_names_translate_like_the_canonical_program() -> None:
    assert translate(FREE_NAMES).code == translate(ISSUE_CHAIN).code


def test_generator_programs_keep_their_names() -> None:
    parsed = parse_program(ISSUE_CHAIN)
    assert parsed.inputs == ["tensor_0", "tensor_1"]
    assert [op.out for op in parsed.ops] == ["tensor_2", "tensor_3", "tensor_4"]
    assert parsed.outputs == ["tensor_4"]


def test_a_reassigned_name_reads_its_value_at_each_line() -> None:
    source = program(
        {"p": [4, 6]},
        ["acc"],
        [
            "y = torch.relu(acc)",
            "acc = torch.tanh(y)",
            "y = torch.add(y, acc)",
            "acc = torch.exp2(y)",
        ],
        "[y, acc]",
    )
    parsed = parse_program(source)
    assert [op.inputs for op in parsed.ops] == [
        ("tensor_0",),
        ("tensor_1",),
        ("tensor_1", "tensor_2"),
        ("tensor_3",),
    ]
    assert parsed.outputs == ["tensor_3", "tensor_4"]
    assert_correct(source, seeds=(0,))


@pytest.mark.parametrize(
    ("spelled", "canonical"),
    [
        ("torch.max(t, 1)[0]", "torch.max(t, dim=1, keepdim=False).values"),
        ("torch.max(t, 1, True).values", "torch.max(t, dim=1, keepdim=True).values"),
        ("torch.nn.functional.softmax(t, 0)", "F.softmax(t, dim=0)"),
        ("torch.cumsum(input=t, dim=-1)", "torch.cumsum(t, dim=1)"),
        ("F.avg_pool1d(t, (2,), stride=[1])", "F.avg_pool1d(t, kernel_size=2, stride=1)"),
        ("torch.clamp(t, -0.5, 0.5)", "torch.clamp(t, min=-0.5, max=0.5)"),
    ],
)
def test_positional_and_keyword_parameters_are_equivalent(spelled: str, canonical: str) -> None:
    def source(call: str) -> str:
        return program({"a": [3, 5]}, ["t"], [f"u = {call}"], "[u]")

    assert translate(source(spelled)).code == translate(source(canonical)).code


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (["u = torch.relu(v)"], "used before it is defined"),
        (["u, w = torch.relu(t), torch.relu(t)"], "one per line"),
        (["if True:\n        u = torch.relu(t)"], "one per line"),
        (["u = torch.relu(t) + 1"], "expected an operator call"),
        (["u = torch.max(t, 1)[1]"], "expected an operator call"),
        (["u = torch.div(t, t, rounding_mode='floor')"], "unexpected argument `rounding_mode`"),
        (["u = torch.relu(input=t, input2=t)"], "unexpected argument"),
    ],
)
def test_other_statements_are_refused_cleanly(body: list[str], message: str) -> None:
    with pytest.raises(TranslationError, match=message):
        translate(program({"a": [3, 5]}, ["t"], body, "[u]"))
