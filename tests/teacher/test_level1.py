"""Every operator, alone: the teacher's kernel matches PyTorch in one kernel.

Normalisations define two: a moments kernel for groups too long and too few to fill a GPU
(launched only then), and the normalising kernel.
"""

from __future__ import annotations

import pytest

from synth.teacher.parse import OPERATORS

from .programs import LEVEL1, SLOW_LEVEL1
from .util import assert_correct, generated_programs

NORMS = {"batch_norm", "layer_norm", "group_norm", "instance_norm"}


def kernels_for(kind: str) -> int:
    return 2 if kind in NORMS else 1


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # masked lanes under NumPy

CASES = [
    pytest.param(kind, index, marks=[pytest.mark.slow] if (kind, index) in SLOW_LEVEL1 else [])
    for kind, programs in LEVEL1.items()
    for index in range(len(programs))
]


@pytest.mark.parametrize(("kind", "index"), CASES)
def test_handwritten_level1(kind: str, index: int) -> None:
    translation = assert_correct(LEVEL1[kind][index])
    assert translation.kernel_count == kernels_for(kind)
    assert translation.operators == (kind,)


@pytest.mark.parametrize("kind", sorted(set(OPERATORS) - {"copy"}))
def test_generated_level1(kind: str) -> None:
    programs = generated_programs(1, 1, seed=7, ops=[kind])
    if programs is None:
        pytest.skip("the synth generator is not importable; the hand-written cases cover this")
    assert programs, f"no cheap {kind} program drawn"
    for source in programs:
        assert assert_correct(source, seeds=(0,)).kernel_count == kernels_for(kind)
