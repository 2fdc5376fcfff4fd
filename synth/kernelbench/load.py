"""Find and import KernelBench-format problem files.

A problem file defines `class Model(nn.Module)`, `get_inputs()` and (optionally)
`get_init_inputs()`, usually with its sizes as module-level globals. The Model is built
under a fixed seed, as the sandbox builds KernelBench problems, so its weights are the
same on every run. `overrides` replaces module globals before anything is called: tests
shrink a problem's sizes that way.
"""

from __future__ import annotations

import hashlib
import re
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INIT_SEED = 42
"""Seed the Model is built under (the sandbox's `INIT_SEED` for KernelBench problems)."""

_LEVEL_DIR = re.compile(r"level[_-]?(\d+)$", re.IGNORECASE)


class ProblemError(Exception):
    """The problem file cannot be read or does not define the KernelBench interface."""


@dataclass
class LoadedProblem:
    """An imported problem: its module and where it came from."""

    name: str
    level: int | None
    module: types.ModuleType
    path: Path | None = None

    @property
    def get_inputs(self) -> Callable[[], Any]:
        return self.module.get_inputs

    def init_inputs(self) -> list[Any]:
        make = getattr(self.module, "get_init_inputs", None)
        return list(make()) if make is not None else []

    def make_model(self) -> Any:
        """`Model(*get_init_inputs())` built under `INIT_SEED` (in training mode, as
        constructed, the way KernelBench runs it)."""
        import torch

        init = self.init_inputs()
        torch.manual_seed(INIT_SEED)
        return self.module.Model(*init)


def level_of(path: Path) -> int | None:
    """The level the nearest `levelN` directory of the path names, if any."""
    for part in reversed(path.parts[:-1]):
        match = _LEVEL_DIR.match(part)
        if match:
            return int(match.group(1))
    return None


def problem_files(paths: Iterable[Path | str]) -> list[Path]:
    """The problem files among `paths`: files as given, directories searched recursively
    for `*.py` (skipping `__init__.py` and names starting with `_`), in sorted order."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(
                p for p in path.rglob("*.py") if p.is_file() and not p.name.startswith("_")
            )
        elif path.is_file():
            found.append(path)
        else:
            raise ProblemError(f"{path}: no such file or directory")
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return unique


def load_problem(
    path: Path | str, *, level: int | None = None, overrides: Mapping[str, Any] | None = None
) -> LoadedProblem:
    """Import a problem file; `level` defaults to the one its path names."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ProblemError(f"{path}: cannot read ({err})") from None
    chosen = level if level is not None else level_of(path.resolve())
    return load_source(source, path.stem, level=chosen, overrides=overrides, path=path)


def load_source(
    source: str,
    name: str,
    *,
    level: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    path: Path | None = None,
) -> LoadedProblem:
    """Import a problem from its source text."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    module_name = f"_drtriton_kernelbench_{digest}"
    filename = str(path) if path is not None else f"<kernelbench {name}>"
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - the user's problem
    except Exception as err:  # noqa: BLE001 - any failure at import is the problem's
        raise ProblemError(f"cannot import: {type(err).__name__}: {err}") from None
    finally:
        sys.modules.pop(module_name, None)
    for required in ("Model", "get_inputs"):
        if not callable(getattr(module, required, None)):
            raise ProblemError(f"the problem does not define `{required}`")
    for key, value in (overrides or {}).items():
        if not hasattr(module, key):
            raise ProblemError(f"override `{key}`: the problem has no global of that name")
        setattr(module, key, value)
    return LoadedProblem(name=name, level=level, module=module, path=path)


def problem_id(name: str, level: int | None) -> str:
    """A stable record id: `kernelbench_l{level}_{name}`."""
    return f"kernelbench_l{level if level is not None else 0}_{name}"
