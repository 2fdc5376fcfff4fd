"""The teacher reads its operator facts from the registry: one table for every reader."""

from __future__ import annotations

import pytest
import torch

from synth.operators import REGISTRY
from synth.teacher import TranslationError
from synth.teacher.check import import_source
from synth.teacher.operators import BY_CALL, COPY, FAMILIES, OPERATORS
from synth.teacher.parse import parse_program
from synth.teacher.translate import TEMPLATES

from .programs import LEVEL1, render
from .util import assert_correct


def test_the_teachers_table_is_the_registry_plus_a_family_each() -> None:
    assert set(OPERATORS) == set(REGISTRY) | {COPY}
    for name, op in REGISTRY.items():
        spec = OPERATORS[name]
        assert spec.call is op.call and spec.arity == op.arity
        assert all(BY_CALL[callee] is spec for callee in op.call.names)
    named = [name for names in FAMILIES.values() for name in names]
    assert len(named) == len(set(named)) == len(REGISTRY)
    templated = set(TEMPLATES) - {None}
    assert set(FAMILIES) - templated == {"pointwise", "layout"}  # the elementwise template's


ALIASES = [(name, alias) for name, op in REGISTRY.items() for alias in op.call.names[1:]]


@pytest.mark.parametrize(("name", "alias"), ALIASES)
def test_every_alias_reads_as_its_canonical_call(name: str, alias: str) -> None:
    canonical = LEVEL1[name][0]
    spelled = canonical.replace(f"{REGISTRY[name].call.name}(", f"{alias}(")
    assert spelled != canonical
    want, got = parse_program(canonical), parse_program(spelled)
    assert [(op.kind, op.inputs, op.params) for op in got.ops] == [
        (op.kind, op.inputs, op.params) for op in want.ops
    ]


def _shapes_match_pytorch(source: str) -> None:
    program = parse_program(source)
    module = import_source(source)
    outputs = module.fused_operator(*module.get_inputs())
    assert [tuple(t.shape) for t in outputs] == [program.shapes[n] for n in program.outputs]


def test_a_convolution_the_generator_never_draws_translates() -> None:
    """Unbatched input, a kernel of different sizes per dim, groups: shapes by the
    registry's rule (the weight gives the kernel), checked against PyTorch."""
    source = render(
        [[4, 7, 9], [6, 2, 3, 2]], ["F.conv2d({0}, {1}, stride=2, padding=1, groups=2)"]
    )
    _shapes_match_pytorch(source)
    assert parse_program(source).shapes["tensor_2"] == (6, 4, 5)
    assert_correct(source, seeds=(0,))


def test_unbatched_pooling_and_rank_one_layer_norm() -> None:
    for source in (
        render([[3, 11]], ["F.max_pool1d({0}, 3, stride=2, padding=1, dilation=2)"]),
        render([[5, 6, 7]], ["F.avg_pool2d({0}, kernel_size=2)"]),
        render([[9]], ["F.layer_norm({0}, normalized_shape=[9])"]),
    ):
        _shapes_match_pytorch(source)


@pytest.mark.parametrize(
    ("inputs", "call", "message"),
    [
        (
            [[2, 3, 9], [4, 2, 3]],
            "F.conv1d({0}, {1})",
            r"line 10: conv1d of shapes .*sizes 2 and 3",
        ),
        ([[2, 3], [4]], "torch.add({0}, {1})", r"line 10: add of shapes \[2, 3\] and \[4\]"),
        ([[2, 3, 4, 5]], "F.max_pool1d({0}, 2)", "`input` must have rank 2 to 3, not 4"),
        ([[2, 3, 4]], "F.avg_pool1d({0}, 2, divisor_override=None)", "unexpected argument"),
        ([[2, 3, 4]], "torch.transpose({0}, 4, 5)", r"dims \(4, 5\) are out of range"),
        ([[2, 3, 4]], "F.max_pool1d({0}, 2, stride=0)", "stride must be >= 1, not 0"),
        ([[2, 3, 4]], "F.max_pool1d({0}, 9)", "does not fit size 4"),
    ],
)
def test_programs_that_do_not_fit_are_refused_with_the_line(
    inputs: list[list[int]], call: str, message: str
) -> None:
    with pytest.raises(TranslationError, match=message):
        parse_program(render(inputs, [call]))


def test_parsed_shapes_are_float32_like_pytorch() -> None:
    """Every operator's printed form (suffix included) keeps float32: shapes suffice."""
    for name in ("argmax", "cummax", "max"):
        module = import_source(LEVEL1[name][0])
        assert all(t.dtype == torch.float32 for t in module.fused_operator(*module.get_inputs()))
