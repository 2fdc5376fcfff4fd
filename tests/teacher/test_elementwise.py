"""Pointwise kernels over merged dims: the host's `merge_dims`, and candidates that use it.

`merge_dims` decides at run time how few coordinates a kernel splits its indices into;
a wrong merge reads the wrong elements, so it is checked on concrete layouts and
against brute-force addressing, and the emitted modules are checked on shapes other
than the ones they were translated from.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from synth.teacher import translate
from synth.teacher.check import import_source
from synth.teacher.templates.elementwise import merge_dims

from .conftest import DEVICE
from .programs import one, render
from .util import assert_correct


def _expanded(shape: list[int], full: list[int]) -> tuple[int, ...]:
    """Strides of a contiguous `shape` tensor expanded to `full` (0 where broadcast)."""
    return torch.empty(shape).expand(full).stride()


@pytest.mark.parametrize(
    ("shape", "strides", "expected"),
    [
        # Same shape, contiguous: one flat dim.
        ((34, 321, 29), [(9309, 29, 1), (9309, 29, 1)], (1, [1, 1, 316506], [[0, 0, 1]] * 2)),
        # Broadcast along leading dims only: [rows, cols], the operand repeats per row.
        (
            (28, 23, 10, 6654),
            [(1530420, 66540, 6654, 1), (0, 0, 0, 1)],
            (2, [1, 1, 6440, 6654], [[0, 0, 6654, 1], [0, 0, 0, 1]]),
        ),
        # A broadcast inner dim: [57, 12, 330, 1] * [12, 330, 4743].
        (
            (57, 12, 330, 4743),
            [(3960, 330, 1, 0), (0, 1565190, 4743, 1)],
            (3, [1, 57, 3960, 4743], [[0, 3960, 1, 0], [0, 0, 4743, 1]]),
        ),
        # Outer product of a column and a row.
        ((6, 7), [(1, 0), (0, 1)], (2, [6, 7], [[1, 0], [0, 1]])),
        # A scalar operand merges with anything.
        ((3, 4, 5), [(20, 5, 1), (0, 0, 0)], (1, [1, 1, 60], [[0, 0, 1], [0, 0, 0]])),
        # Size-1 dims are dropped, whatever their stride.
        ((1, 5, 1, 6), [(99, 6, 7, 1)], (1, [1, 1, 1, 30], [[0, 0, 0, 1]])),
        # A transposed view keeps its two dims apart.
        ((4, 6, 5), [(30, 1, 6), (30, 5, 1)], (3, [4, 6, 5], [[30, 1, 6], [30, 5, 1]])),
        # Rank 0: one dim of size 1.
        ((), [(), ()], (1, [1], [[0], [0]])),
    ],
)
def test_merge_dims_on_concrete_layouts(
    shape: tuple[int, ...],
    strides: list[tuple[int, ...]],
    expected: tuple[int, list[int], list[list[int]]],
) -> None:
    assert merge_dims(shape, *strides) == expected


def _offsets(shape: tuple[int, ...], strides: tuple[int, ...] | list[int]) -> list[int]:
    """Every element's memory offset, in row-major order of `shape`."""
    return [
        sum(i * s for i, s in zip(index, strides, strict=True))
        for index in itertools.product(*(range(n) for n in shape))
    ]


@pytest.mark.parametrize("seed", range(200))
def test_merged_addressing_reads_the_same_elements(seed: int) -> None:
    """Random broadcasts and transposes: merged sizes and strides address every element alike."""
    rng = random.Random(seed)
    rank = rng.randint(0, 5)
    full = [rng.choice([1, 1, 2, 3, 4]) for _ in range(rank)]
    strides = []
    for _ in range(rng.randint(1, 3)):
        shape = [n if rng.random() < 0.6 else 1 for n in full][rng.randint(0, rank) :]
        tensor = torch.empty(shape)
        if len(shape) >= 2 and rng.random() < 0.3:
            tensor = torch.empty(shape[:-2] + shape[-1:] + shape[-2:-1]).transpose(-2, -1)
        strides.append(tensor.expand(full).stride())
    ndim, sizes, merged = merge_dims(tuple(full), *strides)
    assert len(sizes) == max(rank, 1) and 1 <= ndim <= max(rank, 1)
    assert all(n == 1 for n in sizes[: len(sizes) - ndim])
    assert all(n > 1 for n in sizes[len(sizes) - ndim :]) or sizes == [1] * len(sizes)
    for original, new in zip(strides, merged, strict=True):
        assert _offsets(tuple(full), original) == _offsets(tuple(sizes), new)


def test_a_contiguous_chain_is_one_flat_dim() -> None:
    shape = (378, 86, 108, 299)
    strides = torch.empty(shape).stride()
    assert merge_dims(shape, strides, strides)[0] == 1
    assert merge_dims((2, 3, 4), _expanded([4], [2, 3, 4]), (12, 4, 1))[:2] == (2, [1, 6, 4])


BROADCASTS = {
    "inner broadcast": [[5, 3, 4, 1], [3, 4, 7]],
    "leading broadcast": [[2, 3, 2, 2, 9], [9]],
    "interleaved": [[4, 1, 3, 1, 5], [1, 3, 1, 2, 1]],
    "outer product": [[7, 1], [1, 9]],
    "scalar": [[3, 40], []],
    "wide rows": [[2, 2100], [2, 1]],
}


@pytest.mark.parametrize("name", list(BROADCASTS))
def test_broadcast_binary_programs_are_correct(name: str) -> None:
    translation = assert_correct(one(BROADCASTS[name], "torch.sub({0}, {1})"))
    assert "merge_dims(" in translation.code
    assert "%" not in translation.code.split("if NDIM == 1:")[1].split("else:")[0]


def test_a_transposed_operand_in_a_chain() -> None:
    calls = ["torch.transpose({0}, -2, -1)", "torch.mul({2}, {1})", "torch.sigmoid({3})"]
    translation = assert_correct(render([[3, 5, 4], [3, 4, 5]], calls))
    assert "merge_dims(" in translation.code


def test_one_module_serves_other_shapes() -> None:
    """Nothing is specialised to the translated shapes: other broadcasts of the same ranks."""
    code = translate(one([[4, 1, 8], [3, 8]], "torch.maximum({0}, {1})")).code
    module = import_source(code)
    for a, b in [
        ([4, 1, 8], [3, 8]),
        ([2, 5, 1], [1, 6]),
        ([1, 1, 1], [1, 1]),
        ([3, 4, 6], [4, 6]),
    ]:
        x, y = torch.randn(a, device=DEVICE), torch.randn(b, device=DEVICE)
        (got,) = module.triton_fused_operator(x, y)
        assert torch.equal(got, torch.maximum(x, y)), (a, b)
