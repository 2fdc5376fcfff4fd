"""Strided transposed convolutions split their rows by output phase.

Output o = q * stride + r: a kernel offset k reaches phase r only when stride divides
r + padding - k * dilation, and a program skips the others (no loads, no `tl.dot`).
"""

from __future__ import annotations

import math

import pytest
import torch

from synth.teacher import translate
from synth.teacher.check import import_source

from .conftest import DEVICE
from .programs import one, render
from .util import assert_correct

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # masked lanes under NumPy

# (nd, batch, in channels, spatial, out channels per group, kernel, stride, padding,
# output_padding, groups, dilation): strides 1-4, dilations 1-3, with padding, output
# padding and groups; some phases get no kernel offset (stride 2, dilation 2) or no
# output at all (stride 4, one output per dim).
CASES = [
    (1, 2, 4, 5, 3, 3, 1, 1, 0, 2, 3),
    (1, 1, 3, 6, 2, 4, 2, 0, 1, 1, 1),
    (1, 2, 2, 4, 2, 3, 3, 2, 2, 2, 2),
    (1, 1, 2, 5, 3, 5, 4, 3, 3, 1, 3),
    (1, 1, 2, 1, 2, 1, 4, 0, 0, 1, 1),
    (1, 1, 2, 4, 2, 3, 2, 1, 0, 2, 2),
    (2, 1, 4, 3, 2, 3, 2, 1, 1, 2, 1),
    (2, 2, 3, 3, 2, 2, 3, 0, 2, 1, 2),
    (2, 1, 2, 3, 1, 3, 4, 2, 1, 2, 3),
    (2, 1, 4, 4, 2, 2, 2, 1, 1, 4, 3),
    (2, 1, 2, 1, 2, 2, 4, 0, 1, 1, 1),
    (3, 1, 2, 2, 2, 3, 2, 1, 1, 1, 1),
    (3, 1, 4, 2, 1, 2, 3, 1, 0, 2, 2),
    (3, 1, 2, 2, 2, 2, 2, 0, 1, 2, 3),
    (3, 1, 2, 1, 2, 3, 4, 2, 3, 1, 1),
]


def _program(case: tuple[int, ...]) -> str:
    nd, batch, c_in, size, c_out, kernel, stride, padding, out_pad, groups, dilation = case
    x = [batch, c_in] + [size] * nd
    w = [c_in, c_out] + [kernel] * nd
    call = (
        f"F.conv_transpose{nd}d({{0}}, {{1}}, stride={stride}, padding={padding}, "
        f"output_padding={out_pad}, groups={groups}, dilation={dilation})"
    )
    return one([x, w], call)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_transposed_convs_across_strides_and_dilations(case: tuple[int, ...]) -> None:
    assert_correct(_program(case), seeds=(0,))


def test_a_prologue_and_epilogue_around_a_phased_conv() -> None:
    source = render(
        [[1, 4, 2, 3, 3], [4, 1, 3, 2, 3]],
        [
            "torch.selu({0})",
            "F.conv_transpose3d({2}, {1}, stride=2, padding=1, output_padding=1, groups=4, "
            "dilation=2)",
            "torch.tanh({3})",
        ],
    )
    assert assert_correct(source, seeds=(0,)).kernel_count == 1


def _count_dots(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one for every `tl.dot` the interpreter runs from now on."""
    from triton.runtime import interpreter

    dots: list[int] = []
    original = interpreter.InterpreterBuilder.create_dot

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        dots.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", counted)
    return dots


def test_few_channels_a_group_sum_their_products_without_tl_dot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Depthwise-like groups (2 x 1 channels): tl.dot's 16 x 16 tiles would be 98% padding."""
    source = _program((2, 1, 8, 4, 1, 3, 2, 1, 1, 4, 1))
    if DEVICE != "cpu":
        pytest.skip("counts the interpreter's dots")
    dots = _count_dots(monkeypatch)
    problem = import_source(source)
    inputs = problem.get_inputs()
    out = import_source(translate(source).code).triton_fused_operator(*inputs)[0]
    torch.testing.assert_close(out, problem.fused_operator(*inputs)[0], rtol=1e-4, atol=1e-4)
    assert dots == []


def test_only_contributing_offsets_are_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each phase's program runs one `tl.dot` per kernel offset that reaches it: all
    programs together, kernel volume x (row blocks of a phase), not x stride^3 more.
    (16 channels in and out: enough for tl.dot's tiles, which fewer would not use.)"""
    stride, kernel, size = 2, 3, 3
    source = _program((3, 1, 16, size, 16, kernel, stride, 1, 1, 1, 1))
    code = translate(source).code
    assert "if (tap_d % STRIDE == 0) & (tap_h % STRIDE == 0) & (tap_w % STRIDE == 0):" in code
    if DEVICE != "cpu":
        pytest.skip("counts the interpreter's dots")
    dots = _count_dots(monkeypatch)
    problem = import_source(source)
    inputs = problem.get_inputs()
    out = import_source(code).triton_fused_operator(*inputs)[0]
    torch.testing.assert_close(out, problem.fused_operator(*inputs)[0], rtol=1e-4, atol=1e-4)
    # One row block per phase, one channel block: every offset reaches exactly one
    # phase per dim, so the phases' programs do kernel^3 dots between them.
    assert math.ceil((out.shape[-1] / stride) ** 3) <= 128  # one row block a phase
    assert len(dots) == kernel**3, len(dots)
