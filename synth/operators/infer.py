"""Output shapes of operators on known input shapes, from the registry's own shape rules.

Each operator's `shape` rule is written once, against the interface of `synth.dims.
DimSystem` (unify, const, split, window, ...). `Sizes` implements that interface over
plain ints, so the same rule that constrains the generator's solver also computes the
output shape of a given program (the teacher's parser, the KernelBench rewrite): the two
cannot disagree.

Parameters are the call's own (`dim`, `kernel_size`, `groups`, ...). The generator's
private choices (`_broadcast`, `_nonunit`) are absent there, and a rule without them
states PyTorch's rule alone; a convolution without `kernel_size` takes the weight's
sizes. Lower bounds (`at_least`) are the generator's choices against degenerate programs
(reducing a size-1 axis), not validity, so a given program may break them.
"""

from __future__ import annotations

from collections.abc import Sequence

from synth.operators import REGISTRY
from synth.operators.base import Params

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """The input shapes (or parameters) do not fit the operator."""


class Sizes:
    """The `DimSystem` interface over known sizes: a dimension is its size."""

    ONE = 1

    def const(self, value: int) -> int:
        return value

    def fixed(self, a: int) -> int:
        return a

    def unify(self, a: int, b: int) -> None:
        if a != b:
            raise ShapeError(f"sizes {a} and {b} must be equal")

    def at_least(self, a: int, value: int) -> None:
        """The generator's bound against degenerate programs: not checked here."""

    def add(self, a: int, b: int) -> int:
        return a + b

    def split(self, whole: int, parts: int) -> int:
        if parts < 1 or whole % parts:
            raise ShapeError(f"size {whole} does not split into {parts} equal groups")
        return whole // parts

    def scale(self, part: int, parts: int) -> int:
        return part * parts

    def window(self, size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
        _check_window(kernel, stride, padding, dilation)
        out = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
        if out < 1:
            raise ShapeError(
                f"a window of kernel {kernel}, dilation {dilation} does not fit size {size} "
                f"padded by {padding}"
            )
        return out

    def transposed_window(
        self, size: int, kernel: int, stride: int, padding: int, dilation: int, out_pad: int
    ) -> int:
        _check_window(kernel, stride, padding, dilation)
        out = (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + out_pad + 1
        if out < 1:
            raise ShapeError(f"a transposed window gives size {out} from size {size}")
        return out


def _check_window(kernel: int, stride: int, padding: int, dilation: int) -> None:
    bounds = (("kernel_size", kernel, 1), ("stride", stride, 1), ("dilation", dilation, 1))
    for name, value, low in (*bounds, ("padding", padding, 0)):
        if value < low:
            raise ShapeError(f"{name} must be >= {low}, not {value}")


def output_shape(name: str, in_shapes: Sequence[Sequence[int]], params: Params) -> Shape:
    """The output shape of operator `name` on tensors of `in_shapes`; raises `ShapeError`
    naming the operator when they do not fit. A Python-number argument (`torch.mul(x,
    0.5)`, lerp's scalar weight) is a 0-d operand: give it shape `()`, or leave it out,
    as it broadcasts to any shape."""
    op = REGISTRY.get(name)
    if op is None:
        raise ShapeError(f"unknown operator `{name}`")
    shapes = [list(s) for s in in_shapes]
    where = f"{name} of shapes {' and '.join(str(s) for s in shapes)}"
    if op.call is not None:
        reason = op.call.rank_error([len(s) for s in shapes])
        if reason is not None:
            raise ShapeError(f"{where}: {reason}")
    try:
        return tuple(op.shape(Sizes(), shapes, params))  # Sizes: DimSystem over ints
    except ShapeError as err:
        raise ShapeError(f"{where}: {err}") from None
