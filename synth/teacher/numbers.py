"""Python numbers in a program (`torch.mul(x, 0.5)`, `alpha=2`) as a float32 kernel sees them.

Every tensor the teacher handles is float32, and PyTorch computes a float32 tensor with
a Python number (int or float) in float32: the number is rounded to float32 once, and
the result stays float32 (an int promotes to the tensor's float type). The kernel gets
that same value as a literal, the shortest text that reads back as it. Beside a tensor,
Triton gives a literal the tensor's type, as PyTorch does; a literal on its own (lerp's
`tl.abs(weight)`) is fp32 only in float32's normal range (or 0), else fp64. So numbers
whose float32 value is not a finite normal number or zero (beyond float32's range, or
subnormal, which a GPU may flush) are refused, as is an int too large to reach float32
through a double exactly (PyTorch converts the int directly).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from synth.operators.call import is_number

SMALLEST_NORMAL = 2.0**-126
LARGEST_EXACT_INT = 2**53


class NumberError(ValueError):
    """The value is not a number a float32 kernel can use as PyTorch does."""


def _round_to_float32(value: float) -> float:
    try:
        rounded = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        rounded = math.inf
    if math.isinf(rounded) and math.isfinite(value):
        raise NumberError(f"{value!r} is beyond float32's range")
    return rounded


def _fits_fp32_literal(value: float) -> bool:
    """Whether Triton reads `value` as an fp32 literal (not fp64)."""
    return value == 0.0 or SMALLEST_NORMAL <= abs(value) <= (2 - 2**-23) * 2.0**127


def float32_value(value: Any) -> float:
    """The float32 value PyTorch computes with for the Python number `value`."""
    if isinstance(value, bool):
        raise NumberError(f"{value!r} is a bool, not an int or float")
    if isinstance(value, complex):
        raise NumberError(f"{value!r} is complex: the result would not be float32")
    if not is_number(value):
        raise NumberError(f"{value!r} is not a Python number")
    if isinstance(value, int) and abs(value) > LARGEST_EXACT_INT:
        raise NumberError(f"the integer {value} is too large (beyond 2**53)")
    value = float(value)
    if not math.isfinite(value):
        raise NumberError(f"{value!r} is not finite")
    rounded = _round_to_float32(value)
    if not _fits_fp32_literal(rounded):
        raise NumberError(f"{value!r} is not a normal float32 number (or zero)")
    return rounded


def float32_literal(value: float) -> str:
    """The shortest float literal that reads back as float32 `value` (a float32 value,
    as `float32_value` returns), always with a decimal point or exponent."""
    for digits in range(1, 18):
        text = f"{value:.{digits}g}"
        if _reads_back(float(text), value):
            break
    else:  # pragma: no cover - `repr` of a float32 value always reads back
        text = repr(value)
    if not any(c in text for c in ".en"):
        text += ".0"
    return text


def _reads_back(candidate: float, value: float) -> bool:
    """Whether Triton reads `candidate` as an fp32 literal equal to float32 `value`."""
    try:
        return _round_to_float32(candidate) == value and _fits_fp32_literal(candidate)
    except NumberError:
        return False
