"""A seal on the candidate harness's timing clock: whether anything of it changed.

The clock (`sandbox.timing.Clock`) lives in the candidate's process, which the candidate
controls. The static gate keeps candidate code from naming it and the instruments refuse
the ways to find it (walking the garbage collector, frames), but a loop must not rest on
that alone: after every timed loop the harness checks that the clock holds what it held
when it was bound, before any candidate code ran. Swapped fields (a rigged `elapsed`), a
closure cell pointed elsewhere (a smaller L2 flush buffer, another event recorder), code
replaced, the flush buffer resized or re-pointed in place, or the stream hold's state
replaced: each is `tampering`, whatever the loop measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

_get = object.__getattribute__
_data_ptr = torch._C.TensorBase.data_ptr
_numel = torch._C.TensorBase.numel
_tensor = torch.Tensor
_vars = vars
_type = type
_len = len


def _parts(value: Any) -> tuple[Any, ...]:
    """What a clock field runs on: its code, its closure's contents (and, for a tensor among
    them, its address and size), a bound method's object and that object's attributes."""
    found: list[Any] = [value]
    code = getattr(value, "__code__", None)
    if code is not None:
        found.append(code)
    for cell in getattr(value, "__closure__", None) or ():
        content = cell.cell_contents
        found.append(content)
        if _type(content) is _tensor:
            found += [_data_ptr(content), _numel(content)]
    owner = getattr(value, "__self__", None)
    if owner is not None and not isinstance(owner, type | type(torch)):
        found.append(owner)
        attributes = getattr(owner, "__dict__", None)
        for name, item in sorted((attributes or {}).items()):
            if not isinstance(item, int):  # counters (the hold's sequence) change by design
                found += [name, item]
    return tuple(found)


def _same(before: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    if _len(before) != _len(now):
        return False
    for a, b in zip(before, now, strict=True):
        equal_values = _type(a) in (int, str) and _type(b) is _type(a) and a == b
        if a is not b and not equal_values:
            return False
    return True


def seal(clock: Any) -> Callable[[], str | None]:
    """A check of `clock` against what it holds now: None while nothing changed, else what
    did. Call it before any candidate code runs."""
    names = [field.name for field in dataclasses.fields(clock)]
    before = [(name, _parts(_get(clock, name))) for name in names]

    def check() -> str | None:
        for name, parts in before:
            if not _same(parts, _parts(_get(clock, name))):
                return f"changed the timing clock ({name})"
        return None

    return check
