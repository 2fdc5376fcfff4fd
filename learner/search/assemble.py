"""One module from a composition: fragment kernels called in order, PyTorch spans inline.

The result defines `triton_fused_operator` with the program's arguments (or, for a run of
steps, the run's inputs) and returns what the program (or the run) returns. Each converted
span's candidate keeps its own code with its top-level names prefixed (`frag0_...`), its
`triton_fused_operator` called with the values the span reads; a span left as PyTorch is
the program's own lines. Imports are shared: the same import written by two candidates
appears once, and two that bind one name to different things are refused.

A module with PyTorch spans is the search's hybrid answer, runnable as is; the sandbox
refuses PyTorch compute inside a candidate, so it is never sent whole (`learner/README.md`,
"Test-time search", says how it is verified instead).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from learner.search.fragments import span_io
from learner.search.program import StraightLine, value_name
from learner.search.rename import RenameError, prefix_names, top_level_names

ENTRY = "triton_fused_operator"


class AssembleError(ValueError):
    """The parts cannot be put into one module (a name clash, a part without an entry)."""


@dataclass(frozen=True)
class Part:
    """Steps [start, stop) of the program: `code` is the verified candidate of that
    fragment, or None when the span stays PyTorch."""

    start: int
    stop: int
    code: str | None = None

    @property
    def converted(self) -> bool:
        return self.code is not None


def assemble(
    program: StraightLine,
    parts: Sequence[Part],
    *,
    start: int = 0,
    stop: int | None = None,
) -> str:
    """The module running steps [start, stop) (the whole program by default) by `parts`,
    which must tile that range in order."""
    stop = program.n_ops if stop is None else stop
    _check_tiling(parts, start, stop)
    whole = (start, stop) == (0, program.n_ops)
    if whole:
        args, returns = tuple(range(program.n_inputs)), program.returns
    else:
        args, returns = span_io(program, start, stop)
    hybrid = any(not p.converted for p in parts)
    imports = _Imports()
    blocks: list[str] = []
    if hybrid:  # PyTorch spans need the program's own imports and helpers
        for node in program.header:
            if isinstance(node, ast.Import | ast.ImportFrom):
                imports.add(node)
            else:
                blocks.append(ast.unparse(node))
    if hybrid or not imports.binds("torch"):
        imports.add_text("import torch")
    header_blocks = len(blocks)
    body: list[str] = []
    made_by_pytorch: set[int] = set()
    for k, part in enumerate(parts):
        if part.converted:
            entry, block = _candidate_block(part, k, imports)
            blocks.append(block)
            body += _call(program, part, k, entry, made_by_pytorch)
        else:
            steps = program.steps[part.start : part.stop]
            body.append(f"# {_steps(part)} in PyTorch")
            body += [step.statement() for step in steps]
            made_by_pytorch |= {step.value for step in steps}
    body.append(f"return [{', '.join(value_name(v) for v in returns)}]")
    head = f"def {ENTRY}({', '.join(value_name(v) for v in args)}):"
    entry_def = "\n".join([head, *(f"    {line}" for line in body)])
    taken = program.header_names() if hybrid else set()
    _check_names(blocks[header_blocks:], imports, taken)
    return "\n\n\n".join([imports.text(), *blocks, entry_def]) + "\n"


def _check_tiling(parts: Sequence[Part], start: int, stop: int) -> None:
    position = start
    for part in parts:
        if part.start != position or part.stop <= part.start:
            raise AssembleError(f"parts do not tile steps [{start}, {stop}) in order")
        position = part.stop
    if position != stop:
        raise AssembleError(f"parts do not tile steps [{start}, {stop}) in order")


def _candidate_block(part: Part, k: int, imports: _Imports) -> tuple[str, str]:
    """(entry name, the candidate's code without its imports) of converted part `k`."""
    assert part.code is not None
    try:
        renamed = prefix_names(part.code, f"frag{k}_")
    except RenameError as err:
        raise AssembleError(f"fragment [{part.start}, {part.stop}): {err}") from None
    entry = renamed.names.get(ENTRY)
    if entry is None:
        raise AssembleError(f"fragment [{part.start}, {part.stop}) defines no {ENTRY}")
    tree = ast.parse(renamed.source)
    lines = renamed.source.splitlines()
    drop: set[int] = set()
    for index, node in enumerate(tree.body):
        is_docstring = (
            index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        )
        if isinstance(node, ast.Import | ast.ImportFrom) or is_docstring:
            if isinstance(node, ast.Import | ast.ImportFrom):
                imports.add(node)
            drop |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    kept_lines = {
        line
        for node in tree.body
        if not isinstance(node, ast.Import | ast.ImportFrom)
        for line in range(_first_line(node), (node.end_lineno or node.lineno) + 1)
    }
    if drop & kept_lines:
        raise AssembleError(f"fragment [{part.start}, {part.stop}): an import shares a line")
    kept = [line for number, line in enumerate(lines, 1) if number not in drop]
    return entry, _tidy("\n".join(kept))


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _tidy(text: str) -> str:
    """Leading/trailing blank lines dropped, runs of blank lines cut to two."""
    out: list[str] = []
    blank = 0
    for line in text.strip("\n").splitlines():
        blank = blank + 1 if not line.strip() else 0
        if blank <= 2:
            out.append(line.rstrip())
    return "\n".join(out)


def _call(
    program: StraightLine, part: Part, k: int, entry: str, made_by_pytorch: set[int]
) -> list[str]:
    inputs, outputs = span_io(program, part.start, part.stop)
    # A kernel is judged on contiguous inputs; a view a PyTorch span made is copied first.
    args = [
        f"{value_name(v)}.contiguous()" if v in made_by_pytorch else value_name(v) for v in inputs
    ]
    result = f"part{k}_result"
    lines = [
        f"# {_steps(part)} in Triton",
        f"{result} = {entry}({', '.join(args)})",
        f"if isinstance({result}, torch.Tensor):",
        f"    {result} = [{result}]",
    ]
    lines += [f"{value_name(v)} = {result}[{i}]" for i, v in enumerate(outputs)]
    return lines


def _steps(part: Part) -> str:
    if part.stop - part.start == 1:
        return f"step {part.start}"
    return f"steps {part.start}-{part.stop - 1}"


class _Imports:
    """Import statements, one alias each, deduplicated; a name bound twice differently is
    refused."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.future: list[str] = []
        self.bound: dict[str, tuple[object, ...]] = {}

    def add_text(self, text: str) -> None:
        node = ast.parse(text).body[0]
        assert isinstance(node, ast.Import | ast.ImportFrom)
        self.add(node)

    def binds(self, name: str) -> bool:
        return name in self.bound

    def add(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                raise AssembleError("`import *` hides what it binds")
            name = alias.asname or alias.name.split(".")[0]
            if isinstance(node, ast.Import):
                target: tuple[object, ...] = ("module", alias.name if alias.asname else name)
                text = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
            else:
                target = ("from", node.level, node.module, alias.name)
                source = "." * node.level + (node.module or "")
                text = f"from {source} import {alias.name}"
                text += f" as {alias.asname}" if alias.asname else ""
            if name in self.bound and self.bound[name] != target:
                raise AssembleError(f"two fragments import different things as `{name}`")
            self.bound[name] = target
            future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
            lines = self.future if future else self.lines
            if text not in lines:
                lines.append(text)

    def text(self) -> str:
        return "\n".join([*self.future, *self.lines])


def _check_names(fragment_blocks: Sequence[str], imports: _Imports, taken: set[str]) -> None:
    """Each fragment's top-level names are new: not imported, not the program's own (in a
    hybrid), not another fragment's."""
    seen = set(imports.bound) | {ENTRY} | taken
    for block in fragment_blocks:
        for name in top_level_names(ast.parse(block)):
            if name in seen:
                raise AssembleError(f"the name `{name}` is defined twice in the module")
            seen.add(name)
