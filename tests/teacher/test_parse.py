"""Parsing problems: operator table, argument binding, shape inference and errors."""

from __future__ import annotations

import pytest
import torch

from synth.teacher import TranslationError
from synth.teacher.check import import_source
from synth.teacher.parse import OPERATORS, parse_program

from .programs import LEVEL1, random_program, render

EXAMPLE = """\
import torch
import torch.nn.functional as F

def get_inputs():
    tensor_0 = torch.randn([32, 64], dtype=torch.float32)
    tensor_1 = torch.randn([64, 16], dtype=torch.float32)
    return [tensor_0, tensor_1]

def fused_operator(tensor_0, tensor_1):
    tensor_2 = torch.matmul(tensor_0, tensor_1)
    tensor_3 = torch.relu(tensor_2)
    return [tensor_3]
"""


def test_parses_the_design_example() -> None:
    program = parse_program(EXAMPLE)
    assert program.inputs == ["tensor_0", "tensor_1"]
    assert [(op.out, op.kind, op.inputs) for op in program.ops] == [
        ("tensor_2", "matmul", ("tensor_0", "tensor_1")),
        ("tensor_3", "relu", ("tensor_2",)),
    ]
    assert program.outputs == ["tensor_3"]
    assert program.shapes["tensor_2"] == (32, 16)


def test_positional_and_keyword_arguments_bind_alike() -> None:
    keyword = parse_program(render([[4, 5]], ["torch.sum({0}, dim=1, keepdim=True)"]))
    positional = parse_program(render([[4, 5]], ["torch.sum({0}, 1, True)"]))
    assert keyword.ops[0].params == positional.ops[0].params == {"dim": 1, "keepdim": True}
    negative = parse_program(render([[4, 5, 6]], ["torch.softmax({0}, dim=-1)"]))
    assert negative.ops[0].params["dim"] == 2


def test_every_operator_of_the_design_is_covered() -> None:
    assert len(LEVEL1) == 61
    assert set(LEVEL1) == set(OPERATORS) - {"copy"}
    assert all(len(programs) >= 3 for programs in LEVEL1.values())
    try:
        from synth.operators import OPERATOR_NAMES
    except ImportError:
        return
    assert set(OPERATOR_NAMES) == set(LEVEL1)


def _sources() -> list[str]:
    cases = [source for programs in LEVEL1.values() for source in programs]
    return cases + [random_program(5, seed) for seed in range(20)]


@pytest.mark.parametrize("source", _sources())
def test_static_shapes_match_pytorch(source: str) -> None:
    program = parse_program(source)
    module = import_source(source)
    outputs = module.fused_operator(*module.get_inputs())
    assert [tuple(t.shape) for t in outputs] == [program.shapes[name] for name in program.outputs]
    assert all(t.dtype == torch.float32 for t in outputs)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("torch.exp({0})", "line 9: unsupported operator `torch.exp`"),
        ("torch.max({0}, dim=0)", "must be followed by `.values`"),
        ("torch.argmax({0}, dim=0)", "must be followed by `.float()`"),
        ("F.gelu({0}, approximate='tanh')", "exact (erf) GELU"),
        ("torch.sum({0}, dim=5)", "out of range"),
        ("torch.sum({0}, dim=0, bogus=1)", "unexpected argument `bogus`"),
        ("F.layer_norm({0}, normalized_shape=[3])", "not a suffix"),
        ("{0}.relu()", "unsupported operator"),
    ],
)
def test_unsupported_programs_fail_with_a_clear_message(call: str, message: str) -> None:
    with pytest.raises(TranslationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_program(render([[4, 5]], [call]))


def test_malformed_problems_are_refused() -> None:
    with pytest.raises(TranslationError, match="not valid Python"):
        parse_program("def get_inputs(:\n")
    with pytest.raises(TranslationError, match="does not define `fused_operator"):
        parse_program("def get_inputs():\n    return []\n")
    with pytest.raises(TranslationError, match="only float32"):
        parse_program(
            EXAMPLE.replace("[32, 64], dtype=torch.float32", "[32, 64], dtype=torch.float16")
        )
    with pytest.raises(TranslationError, match="may only create tensors with torch.randn"):
        parse_program(EXAMPLE.replace("torch.randn([32, 64]", "torch.rand([32, 64]"))
