"""What each value of a program is (shape and dtype, or a plain constant), without computing it.

A fragment's `get_inputs` must draw inputs of the shapes and dtypes the program feeds it.
The program is run once on PyTorch's meta device, which propagates shapes and dtypes
through every operator but allocates nothing and computes nothing, so a paper-size program
costs milliseconds; should an operator lack a meta implementation, the program is run
once on the CPU at its own shapes instead. The problem's code runs in this process: it is
the user's own program, the same trusted code the sandbox's grader runs as the reference.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any

from learner.search.program import SearchError, StraightLine, value_name

_LITERAL_TYPES = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class ValueSpec:
    """A tensor's shape and dtype (`dtype` as torch names it, e.g. "float32"), or the
    source of a plain constant (`literal`, e.g. "3" or "(2, 2)")."""

    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    literal: str | None = None

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None

    @property
    def opaque(self) -> bool:
        """Neither a tensor nor a constant: no fragment can take it as an input."""
        return self.shape is None and self.literal is None

    @property
    def floating(self) -> bool:
        return self.dtype is not None and self.dtype.startswith(("float", "bfloat", "complex"))


def value_specs(program: StraightLine) -> list[ValueSpec]:
    """One `ValueSpec` per value of `program` (inputs first), from a meta-device run."""
    import torch

    try:
        return _run(program, torch.device("meta"))
    except SearchError:
        raise
    except Exception:  # noqa: BLE001 - an operator without a meta kernel: run it for real
        pass
    try:
        return _run(program, torch.device("cpu"))
    except SearchError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's program failed
        raise SearchError(f"the program does not run: {type(err).__name__}: {err}") from None


def _run(program: StraightLine, device: Any) -> list[ValueSpec]:
    import torch

    namespace: dict[str, Any] = {"__name__": "drtriton_search_problem"}
    try:
        exec(compile(program.source, "<problem>", "exec"), namespace)  # noqa: S102 - trusted
    except Exception as err:  # noqa: BLE001 - the module itself fails to import
        raise SearchError(f"the problem fails to load: {type(err).__name__}: {err}") from None
    with torch.device(device), torch.no_grad():
        inputs = namespace["get_inputs"]()
        if not isinstance(inputs, list | tuple) or len(inputs) != program.n_inputs:
            raise SearchError(
                f"get_inputs() must return a list of {program.n_inputs} values "
                "(one per argument of fused_operator)"
            )
        values = list(inputs)
        for step in program.steps:
            scope = {**namespace, **{value_name(i): v for i, v in enumerate(values)}}
            code = compile(ast.Expression(body=step.expr), f"<line {step.line}>", "eval")
            values.append(eval(code, scope))  # noqa: S307 - the user's own program
    return [_spec(v, i) for i, v in enumerate(values)]


def _spec(value: Any, index: int) -> ValueSpec:
    import torch

    if isinstance(value, torch.Tensor):
        return ValueSpec(shape=tuple(value.shape), dtype=str(value.dtype).removeprefix("torch."))
    if isinstance(value, torch.Size):
        value = tuple(value)
    if _literal(value):
        return ValueSpec(literal=repr(value))
    # Neither a tensor nor a constant (a module, a generator): no fragment may take it.
    return ValueSpec(literal=None)


def _literal(value: Any) -> bool:
    if isinstance(value, tuple | list):
        return all(_literal(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, _LITERAL_TYPES)
