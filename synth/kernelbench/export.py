"""A KernelBench problem to a checked functional program, or the reason it is not one.

`export_problem(path)` loads the file, builds the Model under a fixed seed, exports it,
rewrites the graph (`lower.py`) and checks the program against the Model on fresh
inputs (`check.py`). Every failure, from import to a mismatch, comes back as an
`ExportResult` with `ok=False` and its reason: a problem is never dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth.kernelbench.load import (
    LoadedProblem,
    ProblemError,
    load_problem,
    load_source,
    problem_id,
)

TRACE_SEED = 7
"""Seed of the weights and inputs the rewrite's lines are checked on as they are written."""


@dataclass(frozen=True)
class ExportResult:
    """One problem's rewrite: the program source when `ok`, else the reason."""

    name: str
    ok: bool
    source: str | None
    reason: str | None
    param_inputs: dict[str, str] = field(default_factory=dict)
    """Program input name -> the Model parameter or buffer it stands for."""
    unmapped_ops: tuple[str, ...] = ()
    """ATen operators kept as plain PyTorch lines (not among the registry's operators)."""
    level: int | None = None
    ops: tuple[str, ...] = ()
    """Per line of `fused_operator`: the registry operator, or `aten.<op>`."""
    path: str | None = None

    @property
    def id(self) -> str:
        return problem_id(self.name, self.level)

    def to_record(self) -> dict[str, Any]:
        """The JSONL record (`id`, `level`, `ops`, `source` as program readers expect)."""
        return {
            "id": self.id,
            "name": self.name,
            "level": self.level if self.level is not None else 0,
            "ok": self.ok,
            "reason": self.reason,
            "source": self.source,
            "ops": list(self.ops),
            "param_inputs": dict(self.param_inputs),
            "unmapped_ops": list(self.unmapped_ops),
            "path": self.path,
        }


def _failed(name: str, reason: str, level: int | None, path: str | None) -> ExportResult:
    return ExportResult(name, False, None, reason, level=level, path=path)


def export_problem(
    path: Path | str,
    *,
    level: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    seeds: Sequence[int] | None = None,
) -> ExportResult:
    """Rewrite the problem file at `path` (its level from a `levelN` directory unless
    given; `overrides` replaces module globals, e.g. sizes)."""
    path = Path(path)
    try:
        problem = load_problem(path, level=level, overrides=overrides)
    except ProblemError as err:
        return _failed(path.stem, str(err), level, str(path))
    return export_loaded(problem, seeds=seeds)


def export_source(
    source: str,
    name: str,
    *,
    level: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    seeds: Sequence[int] | None = None,
) -> ExportResult:
    """Rewrite a problem given as source text."""
    try:
        problem = load_source(source, name, level=level, overrides=overrides)
    except ProblemError as err:
        return _failed(name, str(err), level, None)
    return export_loaded(problem, seeds=seeds)


def export_loaded(problem: LoadedProblem, *, seeds: Sequence[int] | None = None) -> ExportResult:
    """Rewrite an imported problem: its Model built under the fixed seed."""
    path = str(problem.path) if problem.path is not None else None
    try:
        model = problem.make_model()
    except Exception as err:  # noqa: BLE001 - the problem's own failure
        reason = f"Model(*get_init_inputs()) fails: {type(err).__name__}: {err}"
        return _failed(problem.name, reason, problem.level, path)
    return export_model(
        problem.name, model, problem.get_inputs, level=problem.level, path=path, seeds=seeds
    )


def export_model(
    name: str,
    model: Any,
    make_inputs: Callable[[], Sequence[Any]],
    *,
    level: int | None = None,
    path: str | None = None,
    seeds: Sequence[int] | None = None,
) -> ExportResult:
    """Rewrite `model` (an `nn.Module`, as constructed) called on `make_inputs()`."""
    import torch

    from synth.kernelbench.check import DEFAULT_SEEDS, check_program, random_state
    from synth.kernelbench.graph import ExportFailure, export_graph, trace_values
    from synth.kernelbench.lower import LoweringError, lower

    def failed(reason: str) -> ExportResult:
        return _failed(name, reason, level, path)

    if not isinstance(model, torch.nn.Module):
        return failed(f"Model is a {type(model).__name__}, not an nn.Module")
    torch.manual_seed(TRACE_SEED)
    try:
        inputs = list(make_inputs())
    except Exception as err:  # noqa: BLE001
        return failed(f"get_inputs() fails: {type(err).__name__}: {err}")
    for index, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            return failed(
                f"input {index} is {kind}: the functional format draws every input with "
                "torch.randn (floating point)"
            )
    try:
        graph = export_graph(model, inputs)
        trace = trace_values(graph, inputs, random_state(model, TRACE_SEED))
        lowered = lower(graph, trace)
    except (ExportFailure, LoweringError) as err:
        return failed(str(err))
    except Exception as err:  # noqa: BLE001 - the Model fails on its traced graph
        return failed(f"the exported graph fails: {type(err).__name__}: {err}")
    namespace: dict[str, Any] = {}
    exec(compile(lowered.source, f"<rewrite of {name}>", "exec"), namespace)  # noqa: S102
    why = check_program(
        namespace["fused_operator"],
        namespace["get_inputs"],
        model,
        make_inputs,
        lowered.param_feeds,
        seeds=DEFAULT_SEEDS if seeds is None else seeds,
    )
    if why is not None:
        return failed(why)
    return ExportResult(
        name=name,
        ok=True,
        source=lowered.source,
        reason=None,
        param_inputs=lowered.param_inputs,
        unmapped_ops=tuple(lowered.unmapped_ops),
        level=level,
        ops=tuple(lowered.ops),
        path=path,
    )
