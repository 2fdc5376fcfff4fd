"""ATen calls as plain PyTorch lines: operators outside the registry stay runnable.

An ATen call is printed from its schema: arguments by position up to the last one that
differs from its default, keyword-only ones by keyword. The public spelling
(`torch.<op>` or `F.<op>`) is preferred, and kept only if it computes what the ATen
call computed on the example values; `torch.ops.aten.<op>.<overload>` is exact and
always last. Device arguments print as the device of a tensor of the program, never a
fixed device, so the problem runs wherever its inputs are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from synth.kernelbench.program import literal

PUBLIC_SPELLING = {"view": "torch.reshape", "_unsafe_view": "torch.reshape"}
"""ATen operators whose public function has another name."""


class UnprintableCall(Exception):
    """The call has an argument with no source form."""


@dataclass(frozen=True)
class AtenCall:
    """An ATen call with every schema argument bound (defaults filled in)."""

    target: torch._ops.OpOverload
    args: dict[str, Any]

    @property
    def packet(self) -> str:
        return self.target.overloadpacket.__name__

    @property
    def label(self) -> str:
        return f"aten.{self.packet}"

    @property
    def schema_args(self) -> list[Any]:
        return list(self.target._schema.arguments)


def bind(node: Node) -> AtenCall:
    """The node's call with its arguments by schema name."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        raise UnprintableCall(f"`{target}` is not an ATen operator")
    bound: dict[str, Any] = {}
    for index, arg in enumerate(target._schema.arguments):
        if index < len(node.args) and not arg.kwarg_only:
            bound[arg.name] = node.args[index]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise UnprintableCall(f"{target} is missing `{arg.name}`")
    return AtenCall(target, bound)


def same(a: Any, b: Any) -> bool:
    """Argument values equal as PyTorch reads them (tuples as lists, 1 as 1.0)."""
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return (
            isinstance(a, list | tuple)
            and isinstance(b, list | tuple)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    if a is None or b is None:
        return a is b
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values of unlike kinds differ
        return False


def argument_text(value: Any, ref: Callable[[Node], str], anchor: str | None) -> str:
    """Source text of one argument: tensors by name, devices as a tensor's device."""
    if isinstance(value, Node):
        return ref(value)
    if isinstance(value, torch.device):
        if anchor is None:
            raise UnprintableCall("a device argument with no tensor to take it from")
        return f"{anchor}.device"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(argument_text(v, ref, anchor) for v in value) + "]"
    try:
        return literal(value)
    except Exception as err:  # noqa: BLE001 - no source form
        raise UnprintableCall(str(err)) from None


def spellings(
    call: AtenCall, ref: Callable[[Node], str], anchor: str | None, index: int | None = None
) -> list[str]:
    """Candidate lines for `call` (its `index`-th result for a tuple), best first."""
    positional: list[str] = []
    keywords: list[str] = []
    pending: list[str] = []
    for arg in call.schema_args:
        value = call.args[arg.name]
        text = argument_text(value, ref, anchor)
        at_default = arg.has_default_value() and same(value, arg.default_value)
        if arg.kwarg_only:
            if not at_default:
                keywords.append(f"{arg.name}={text}")
        elif at_default:
            pending.append(text)  # printed only if a later positional argument is
        else:
            positional += pending + [text]
            pending = []
    arguments = ", ".join(positional + keywords)
    suffix = f"[{index}]" if index is not None else ""
    names = []
    packet = call.packet
    if packet in PUBLIC_SPELLING:
        names.append(PUBLIC_SPELLING[packet])
    if not packet.startswith("_"):
        if callable(getattr(torch, packet, None)):
            names.append(f"torch.{packet}")
        if callable(getattr(F, packet, None)):
            names.append(f"F.{packet}")
    names.append(f"torch.ops.aten.{packet}.{call.target._overloadname}")
    return [f"{name}({arguments}){suffix}" for name in names]
