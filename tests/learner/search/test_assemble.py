"""Compositions put into one module: kernels of several fragments, PyTorch spans inline."""

from __future__ import annotations

import pytest
import torch

from learner.policies.teacher import TeacherPolicy
from learner.search.assemble import AssembleError, Part, assemble
from learner.search.fragments import make_fragment
from learner.search.program import parse
from learner.search.values import value_specs

from .programs import SEVEN_OPS, load, reference


def _teacher_code(source: str, start: int, stop: int) -> str:
    program = parse(source)
    fragment = make_fragment(program, value_specs(program), start, stop)
    (proposal,) = TeacherPolicy().propose([fragment.problem])[0]
    assert proposal.code is not None, proposal.error
    return proposal.code


def _same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_all_triton_assembly_is_one_correct_candidate_the_gate_accepts() -> None:
    from sandbox.gate import violations
    from synth.teacher.check import check_candidate

    cuts = [(0, 2), (2, 3), (3, 5), (5, 7)]
    parts = [Part(a, b, _teacher_code(SEVEN_OPS, a, b)) for a, b in cuts]
    module = assemble(parse(SEVEN_OPS), parts)
    assert module.count("def triton_fused_operator(") == 1
    assert "def frag0_triton_fused_operator(" in module and "def frag3_" in module
    assert module.count("import triton.language as tl") == 1
    assert violations(module) == []
    result = check_candidate(SEVEN_OPS, module, seeds=(0, 1), device="cpu")
    assert result.correct, result.message


def test_hybrid_module_runs_pytorch_spans_inline() -> None:
    parts = [
        Part(0, 2, _teacher_code(SEVEN_OPS, 0, 2)),
        Part(2, 4),  # relu, softmax stay PyTorch
        Part(4, 6, _teacher_code(SEVEN_OPS, 4, 6)),
        Part(6, 7),
    ]
    module = assemble(parse(SEVEN_OPS), parts)
    assert "tensor_6 = torch.softmax(tensor_5, dim=1)" in module
    assert "frag2_triton_fused_operator(tensor_6.contiguous(), tensor_4)" in module
    inputs, expected = reference(SEVEN_OPS, seed=5)
    _same(load(module).triton_fused_operator(*inputs), expected)


def test_a_run_of_steps_takes_the_runs_inputs_and_returns_what_is_used_after() -> None:
    program = parse(SEVEN_OPS)
    module = assemble(program, [Part(4, 6, _teacher_code(SEVEN_OPS, 4, 6))], start=4, stop=6)
    assert "def triton_fused_operator(tensor_6, tensor_4):" in module
    assert "return [tensor_8]" in module


def test_identical_candidates_do_not_clash() -> None:
    code = _teacher_code(SEVEN_OPS, 2, 3)  # relu
    source = SEVEN_OPS.replace(
        "    tensor_6 = torch.softmax(tensor_5, dim=1)", "    tensor_6 = torch.relu(tensor_5)"
    )
    module = assemble(parse(source), [Part(2, 3, code), Part(3, 4, code)], start=2, stop=4)
    assert "def frag0_" in module and "def frag1_" in module
    inputs, expected = reference(source, seed=1)
    t4 = torch.add(torch.matmul(inputs[0], inputs[1]), inputs[2])
    _same(load(module).triton_fused_operator(t4), [torch.relu(torch.relu(t4))])


def test_parts_must_tile_the_range() -> None:
    program = parse(SEVEN_OPS)
    with pytest.raises(AssembleError, match="tile"):
        assemble(program, [Part(0, 2), Part(3, 7)])
    with pytest.raises(AssembleError, match="tile"):
        assemble(program, [Part(0, 6)])


def test_conflicting_imports_and_missing_entries_are_refused() -> None:
    program = parse(SEVEN_OPS)
    good = _teacher_code(SEVEN_OPS, 0, 1)
    odd = good.replace("import triton.language as tl", "import triton.language.math as tl")
    with pytest.raises(AssembleError, match="different things as `tl`"):
        assemble(program, [Part(0, 1, good), Part(1, 2, odd)], start=0, stop=2)
    no_entry = good.replace("def triton_fused_operator(", "def other_name(")
    with pytest.raises(AssembleError, match="defines no triton_fused_operator"):
        assemble(program, [Part(0, 1, no_entry)], start=0, stop=1)
