"""A program as a straight line, and its fragments as problems of their own."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from learner.search.fragments import (
    Unfragmentable,
    candidate_fragments,
    make_fragment,
    span_io,
)
from learner.search.program import SearchError, parse
from learner.search.values import value_specs

from .programs import FOUR_OPS, SEVEN_OPS, SEVEN_OPS_FREE_NAMES, load, reference


def _partitions(n: int, max_ops: int, rng: random.Random, count: int) -> list[list[int]]:
    """Random cut points of [0, n) into spans of at most `max_ops`, plus the extremes."""
    found = [list(range(n + 1))]  # one operator each
    for _ in range(count):
        cuts, position = [0], 0
        while position < n:
            position = min(n, position + rng.randint(1, max_ops))
            cuts.append(position)
        found.append(cuts)
    return found


def _run_in_fragments(source: str, cuts: list[int], seed: int) -> list[torch.Tensor]:
    """The program's outputs computed fragment by fragment, each fragment's own problem
    module called on the values the earlier fragments produced."""
    program = parse(source)
    specs = value_specs(program)
    inputs, _ = reference(source, seed)
    values: dict[int, Any] = dict(enumerate(inputs))
    for start, stop in zip(cuts, cuts[1:], strict=False):
        fragment = make_fragment(program, specs, start, stop)
        module = load(fragment.problem)
        drawn = module.get_inputs()  # the shapes and dtypes the program feeds it
        for value, example in zip(fragment.inputs, drawn, strict=True):
            assert example.shape == values[value].shape and example.dtype == values[value].dtype
        with torch.no_grad():
            outputs = module.fused_operator(*(values[v] for v in fragment.inputs))
        assert len(outputs) == len(fragment.outputs)
        values.update(zip(fragment.outputs, outputs, strict=True))
    return [values[v] for v in program.returns]


@pytest.mark.parametrize("source", [SEVEN_OPS, SEVEN_OPS_FREE_NAMES], ids=["canonical", "free"])
def test_fragments_of_a_seven_op_program_run_in_sequence_reproduce_it(source: str) -> None:
    rng = random.Random(7)
    _, expected = reference(source, seed=3)
    assert parse(source).n_ops == 7
    for cuts in _partitions(7, 5, rng, count=8):
        got = _run_in_fragments(source, cuts, seed=3)
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b), f"cuts {cuts}"


def test_check_problem_feeds_the_fragment_the_programs_own_values() -> None:
    program = parse(SEVEN_OPS)
    specs = value_specs(program)
    fragment = make_fragment(program, specs, 4, 6)  # sum, mul: reads tensor_6 and tensor_4
    assert fragment.inputs == (6, 4) and fragment.outputs == (8,)
    module = load(SEVEN_OPS)
    torch.manual_seed(11)
    x0, x1, x2 = module.get_inputs()
    t4 = torch.add(torch.matmul(x0, x1), x2)
    t6 = torch.softmax(torch.relu(t4), dim=1)
    check = load(fragment.check_problem)
    torch.manual_seed(11)
    drawn = check.get_inputs()
    assert torch.equal(drawn[0], t6) and torch.equal(drawn[1], t4)
    # Same operator in both forms: only get_inputs differs.
    assert (
        fragment.problem.split("def fused_operator")[1]
        == fragment.check_problem.split("def fused_operator")[1]
    )


def test_fragment_problems_are_in_the_generators_format() -> None:
    program = parse(SEVEN_OPS_FREE_NAMES)
    fragment = make_fragment(program, value_specs(program), 4, 6)  # sum, mul
    assert "def fused_operator(tensor_0, tensor_1):" in fragment.problem
    assert "tensor_0 = torch.randn([6, 5], dtype=torch.float32)" in fragment.problem
    assert "tensor_2 = torch.sum(tensor_0, dim=0, keepdim=True)" in fragment.problem
    assert "tensor_3 = torch.mul(tensor_1, tensor_2)" in fragment.problem
    assert "return [tensor_3]" in fragment.problem
    assert fragment.lines[0] == "tensor_7 = torch.sum(tensor_6, dim=0, keepdim=True)"


def test_reused_names_become_distinct_values() -> None:
    program = parse(SEVEN_OPS_FREE_NAMES)
    assert program.n_inputs == 3 and program.n_ops == 7
    assert [s.reads for s in program.steps] == [(0, 1), (3, 2), (4,), (5,), (6,), (4, 7), (8,)]
    assert program.returns == (9, 6)  # the return's transpose became the last step
    assert span_io(program, 2, 5) == ((4,), (6, 7))


def test_candidate_fragments_cover_every_short_span() -> None:
    program = parse(FOUR_OPS)
    fragments, skipped = candidate_fragments(program, value_specs(program), max_ops=3)
    assert not skipped
    assert [f.span for f in fragments] == [
        (0, 1), (1, 2), (2, 3), (3, 4), (0, 2), (1, 3), (2, 4), (0, 3), (1, 4),
    ]  # fmt: skip


def test_a_span_whose_results_are_unused_is_skipped_with_its_reason() -> None:
    source = FOUR_OPS.replace(
        "    tensor_5 = torch.sum(tensor_4, dim=1, keepdim=True)\n",
        "    tensor_5 = torch.sum(tensor_4, dim=1, keepdim=True)\n"
        "    tensor_6 = torch.cos(tensor_2)\n",
    )
    program = parse(source)
    specs = value_specs(program)
    with pytest.raises(Unfragmentable, match="used later or returned"):
        make_fragment(program, specs, 4, 5)
    _, skipped = candidate_fragments(program, specs, max_ops=1)
    assert [(s.start, s.stop) for s in skipped] == [(4, 5)]


def test_value_specs_come_from_a_meta_run() -> None:
    program = parse(SEVEN_OPS)
    specs = value_specs(program)
    assert [s.shape for s in specs] == [
        (6, 8), (8, 5), (6, 1), (6, 5), (6, 5), (6, 5), (6, 5), (1, 5), (6, 5), (5, 6),
    ]  # fmt: skip
    assert {s.dtype for s in specs} == {"float32"}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("    if True:\n        t = torch.relu(x)\n    return [t]\n", "one `name = operator"),
        ("    a, b = torch.relu(x), x\n    return [a]\n", "one `name = operator"),
        ("    t = torch.relu(u)\n    u = torch.cos(x)\n    return [t]\n", "before it is defined"),
        ("    t = torch.relu(x)\n    return [missing]\n", "not a value"),
        ("    t = torch.relu(x)\n", "must end with `return"),
        ("    return [x]\n", "applies no operator"),
    ],
)
def test_programs_that_are_not_straight_lines_are_refused_with_the_reason(
    body: str, match: str
) -> None:
    source = "import torch\n\ndef get_inputs():\n    return [torch.randn(4)]\n\n"
    source += "def fused_operator(x):\n" + body
    with pytest.raises(SearchError, match=match):
        parse(source)


def test_a_problem_without_fused_operator_is_refused() -> None:
    with pytest.raises(SearchError, match="fused_operator"):
        parse("import torch\n\ndef get_inputs():\n    return []\n")
