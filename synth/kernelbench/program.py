"""The rewritten program under construction: inputs, one line per operator, the source.

Every line is evaluated on example values as it is written, so a line that does not
run (or, checked by the caller, does not compute what the graph computed) is known at
once and can be rolled back and written another way. Lines refer to values by
provisional names (`__v7`); the source renames them `tensor_N` in creation order, inputs
first, with lines that read only parameters (a bias reshaped for broadcasting) ahead of
the rest, so the operators that do the work stay contiguous.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_REF = re.compile(r"\b__v(\d+)\b")

HEADER = "import torch\nimport torch.nn.functional as F\n"


def refs(expr: str) -> set[str]:
    """The provisional names a line reads."""
    return {match.group(0) for match in _REF.finditer(expr)}


class LineError(Exception):
    """A written line does not run on the example values."""


@dataclass
class Value:
    """A tensor of the program."""

    ref: str
    example: Any
    param_only: bool
    """Computed from parameters alone (or a parameter itself)."""
    is_input: bool = False


@dataclass(frozen=True)
class Line:
    out: Value
    expr: str
    label: str
    """The registry operator's name, or `aten.<op>` for a line kept as plain PyTorch."""
    mapped: bool


def literal(value: Any) -> str:
    """A Python number, string, dtype, layout or memory format as source text."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, int | str):
        return repr(value)
    if isinstance(value, torch.dtype | torch.layout | torch.memory_format):
        return str(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise LineError(f"cannot print a {type(value).__name__} argument")


class ProgramBuilder:
    def __init__(self) -> None:
        self.inputs: list[Value] = []
        self.lines: list[Line] = []
        self._values: dict[str, Value] = {}
        self._count = 0

    def _new(self, example: Any, param_only: bool, is_input: bool = False) -> Value:
        value = Value(f"__v{self._count}", example, param_only, is_input)
        self._count += 1
        self._values[value.ref] = value
        return value

    def add_input(self, example: torch.Tensor, *, param: bool) -> Value:
        value = self._new(example, param_only=param, is_input=True)
        self.inputs.append(value)
        return value

    def mark(self) -> int:
        return len(self.lines)

    def rollback(self, mark: int) -> None:
        del self.lines[mark:]

    def evaluate(self, expr: str) -> Any:
        """`expr` on the example values; raises `LineError` if it fails."""
        namespace: dict[str, Any] = {"__builtins__": {"float": float}, "torch": torch, "F": F}
        for ref in _REF.findall(expr):
            namespace[f"__v{ref}"] = self._values[f"__v{ref}"].example
        try:
            with torch.no_grad():
                return eval(expr, namespace)  # noqa: S307 - text this module wrote
        except Exception as err:  # noqa: BLE001 - the line is rejected with the reason
            raise LineError(f"`{expr}` fails: {type(err).__name__}: {err}") from None

    def emit(self, expr: str, label: str, *, mapped: bool) -> Value:
        """Write `out = expr` and return `out` (with its example value)."""
        result = self.evaluate(expr)
        if not isinstance(result, torch.Tensor):
            raise LineError(f"`{expr}` gives a {type(result).__name__}, not a tensor")
        refs = [self._values[f"__v{r}"] for r in _REF.findall(expr)]
        param_only = bool(refs) and all(v.param_only for v in refs)
        out = self._new(result, param_only)
        self.lines.append(Line(out, expr, label, mapped))
        return out

    def prune(self, outputs: list[Value]) -> None:
        """Drop lines no output depends on (the parts of a pattern written as one
        operator, statistics a rewrite replaced)."""
        live = {value.ref for value in outputs}
        kept: list[Line] = []
        for line in reversed(self.lines):
            if line.out.ref in live:
                live |= refs(line.expr)
                kept.append(line)
        self.lines = kept[::-1]

    def ordered_lines(self) -> list[Line]:
        hoisted = [line for line in self.lines if line.out.param_only]
        return hoisted + [line for line in self.lines if not line.out.param_only]

    def source(self, outputs: list[Value]) -> tuple[str, dict[str, str]]:
        """The program's source and the final name of each provisional one."""
        names: dict[str, str] = {}
        for value in self.inputs:
            names[value.ref] = f"tensor_{len(names)}"
        lines = self.ordered_lines()
        for line in lines:
            names[line.out.ref] = f"tensor_{len(names)}"

        def rename(text: str) -> str:
            return _REF.sub(lambda m: names[m.group(0)], text)

        body = ["", "", "def get_inputs():"]
        for value in self.inputs:
            shape = literal(list(value.example.shape))
            body.append(
                f"    {names[value.ref]} = torch.randn({shape}, dtype={literal(value.example.dtype)})"
            )
        body.append("    return [" + ", ".join(names[v.ref] for v in self.inputs) + "]")
        args = ", ".join(names[v.ref] for v in self.inputs)
        body += ["", "", f"def fused_operator({args}):"]
        body += [f"    {names[line.out.ref]} = {rename(line.expr)}" for line in lines]
        body.append("    return [" + ", ".join(names[v.ref] for v in outputs) + "]")
        return HEADER + "\n".join(body) + "\n", names
