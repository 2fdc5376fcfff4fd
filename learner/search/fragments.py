"""Fragments: contiguous runs of a program's operators, each a problem of its own.

A fragment [start, stop) takes as inputs the values it reads that were made before it
(program inputs or earlier operators' results) and returns the values it makes that are
read later or returned by the program. It is written twice, with the same
`fused_operator` (values renumbered `tensor_0...` in order, as the generator numbers them):

- `problem`: `get_inputs` draws random inputs of the right shapes and dtypes, the format
  the policy was trained on (DESIGN §2). This is what a policy is asked.
- `check_problem`: `get_inputs` draws the program's own inputs and runs the program's
  operators before the fragment in PyTorch, so the sandbox judges a kernel on the values
  the program really feeds it (non-negative after a relu, summing to one after a softmax),
  not only on Gaussian noise. This is what the sandbox judges, and how a run of converted
  fragments with PyTorch before it is verified as one candidate.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from learner.search.program import SearchError, StraightLine, value_name
from learner.search.values import ValueSpec

DEFAULT_MAX_OPS = 5


class Unfragmentable(ValueError):
    """This span cannot stand alone as a problem (it returns nothing, or a non-tensor)."""


@dataclass(frozen=True)
class Fragment:
    start: int  # first step
    stop: int  # one past the last step
    inputs: tuple[int, ...]  # program values it reads, in order of first use
    outputs: tuple[int, ...]  # program values it makes that are used after it
    problem: str  # random inputs: what a policy is asked
    check_problem: str  # the program's own values as inputs: what the sandbox judges
    lines: tuple[str, ...]  # its operators, in the program's canonical names

    @property
    def span(self) -> tuple[int, int]:
        return (self.start, self.stop)

    @property
    def n_ops(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Skipped:
    start: int
    stop: int
    reason: str


def span_io(
    program: StraightLine, start: int, stop: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(inputs, outputs) of steps [start, stop): values read from before, values used after."""
    if not 0 <= start < stop <= program.n_ops:
        raise ValueError(f"span [{start}, {stop}) is outside the program's {program.n_ops} steps")
    first = program.n_inputs + start
    last = program.n_inputs + stop
    inputs: list[int] = []
    for step in program.steps[start:stop]:
        inputs += [v for v in step.reads if v < first and v not in inputs]
    used_after = {v for step in program.steps[stop:] for v in step.reads} | set(program.returns)
    outputs = tuple(v for v in range(first, last) if v in used_after)
    return tuple(inputs), outputs


def make_fragment(
    program: StraightLine, specs: Sequence[ValueSpec], start: int, stop: int
) -> Fragment:
    """Fragment [start, stop) of `program`; `Unfragmentable` when it cannot stand alone."""
    inputs, outputs = span_io(program, start, stop)
    if not outputs:
        raise Unfragmentable("nothing it makes is used later or returned")
    for v in outputs:
        if not specs[v].is_tensor:
            raise Unfragmentable(f"{value_name(v)} is not a tensor, so it cannot be compared")
    for v in inputs:
        if specs[v].opaque:
            raise Unfragmentable(f"input {value_name(v)} is neither a tensor nor a constant")
    local = {v: value_name(i) for i, v in enumerate(inputs)}
    first = program.n_inputs + start
    local.update({first + k: value_name(len(inputs) + k) for k in range(stop - start)})
    operator = _fused_operator(program, start, stop, inputs, outputs, local)
    header = _header(program)
    problem = _module(header, _random_inputs(inputs, specs, local), operator)
    program_inputs = _fresh("program_inputs", program.header_names())
    own = ast.unparse(_renamed_def(program.get_inputs, program_inputs))
    prefix = _prefix_inputs(program, inputs, program_inputs)
    check = _module(header, f"{own}\n\n\n{prefix}", operator)
    lines = tuple(step.statement() for step in program.steps[start:stop])
    return Fragment(start, stop, inputs, outputs, problem, check, lines)


def candidate_fragments(
    program: StraightLine, specs: Sequence[ValueSpec], max_ops: int = DEFAULT_MAX_OPS
) -> tuple[list[Fragment], list[Skipped]]:
    """Every contiguous span of at most `max_ops` operators, as a fragment or with the
    reason it cannot be one; shorter spans first, then by start."""
    if max_ops < 1:
        raise SearchError(f"max_fragment_ops must be at least 1, got {max_ops}")
    fragments: list[Fragment] = []
    skipped: list[Skipped] = []
    for length in range(1, min(max_ops, program.n_ops) + 1):
        for start in range(program.n_ops - length + 1):
            try:
                fragments.append(make_fragment(program, specs, start, start + length))
            except Unfragmentable as err:
                skipped.append(Skipped(start, start + length, str(err)))
    return fragments, skipped


# -- source ---------------------------------------------------------------------------------


def _header(program: StraightLine) -> str:
    lines = [ast.unparse(node) for node in program.header]
    binds_torch = any(
        isinstance(node, ast.Import) and any(a.name == "torch" and not a.asname for a in node.names)
        for node in program.header
    )
    if not binds_torch:
        lines.insert(0, "import torch")
    return "\n".join(lines)


def _module(header: str, get_inputs: str, operator: str) -> str:
    return f"{header}\n\n\n{get_inputs}\n\n\n{operator}\n"


def _fused_operator(
    program: StraightLine,
    start: int,
    stop: int,
    inputs: Sequence[int],
    outputs: Sequence[int],
    local: dict[int, str],
) -> str:
    body = [f"    {step.statement(local)}" for step in program.steps[start:stop]]
    head = f"def fused_operator({', '.join(local[v] for v in inputs)}):"
    tail = f"    return [{', '.join(local[v] for v in outputs)}]"
    return "\n".join([head, *body, tail])


def _random_inputs(inputs: Sequence[int], specs: Sequence[ValueSpec], local: dict[int, str]) -> str:
    body = [f"    {local[v]} = {_draw(specs[v])}" for v in inputs]
    tail = f"    return [{', '.join(local[v] for v in inputs)}]"
    return "\n".join(["def get_inputs():", *body, tail])


def _draw(spec: ValueSpec) -> str:
    """Source that draws a random value like `spec` (a constant is itself)."""
    if not spec.is_tensor:
        assert spec.literal is not None
        return spec.literal
    shape = f"[{', '.join(str(d) for d in spec.shape or ())}]"
    dtype = f"torch.{spec.dtype}"
    if spec.dtype == "bool":
        return f"torch.randn({shape}) > 0"
    if spec.floating:
        return f"torch.randn({shape}, dtype={dtype})"
    if spec.dtype is not None and spec.dtype.startswith("uint"):
        return f"torch.randint(0, 16, {shape}, dtype={dtype})"
    if spec.dtype is not None and spec.dtype.startswith("int"):
        return f"torch.randint(-8, 9, {shape}, dtype={dtype})"
    return f"torch.randn({shape}).to({dtype})"


def _prefix_inputs(program: StraightLine, inputs: Sequence[int], program_inputs: str) -> str:
    """`get_inputs` that returns `inputs` as the program computes them: its own inputs, then
    the operators they need, in PyTorch."""
    needed: set[int] = set()
    pending = list(inputs)
    while pending:
        v = pending.pop()
        if v in needed:
            continue
        needed.add(v)
        step = program.step_of(v)
        if step is not None:
            pending += program.steps[step].reads
    drawn = _fresh("program_values", program.header_names())
    body = [f"    {drawn} = {program_inputs}()"]
    body += [f"    {value_name(i)} = {drawn}[{i}]" for i in range(program.n_inputs) if i in needed]
    body += [f"    {step.statement()}" for step in program.steps if step.value in needed]
    body.append(f"    return [{', '.join(value_name(v) for v in inputs)}]")
    return "\n".join(["def get_inputs():", *body])


def _renamed_def(fn: ast.FunctionDef, name: str) -> ast.FunctionDef:
    copy = ast.parse(ast.unparse(fn)).body[0]
    assert isinstance(copy, ast.FunctionDef)
    copy.name = name
    return copy


def _fresh(name: str, taken: set[str]) -> str:
    candidate, k = name, 1
    while candidate in taken:
        k += 1
        candidate = f"{name}_{k}"
    return candidate
