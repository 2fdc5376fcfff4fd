"""The static gate: a candidate's source checked against an allowlist before any of it runs.

`violations(source)` lists every construct outside the policy (`sandbox.gate.policy`),
each naming its line, and what the text hides from the parser (`source_text`: encoding
declarations, `def` lines in strings that Triton would take for a kernel's start); `sandbox.static_checks` turns the first ones into the
`disallowed_code` verdict. What it closes: other modules, dynamic attribute access and
strings turned into names, dunders and private names, monkey-patching, import-time side
effects, PyTorch compute called by name in host code, kernel bodies outside the Triton
language, host code run inside a launch (grids, hooks: checked as pure callbacks), and
the direct forms of state kept across calls. What it leaves to the runtime checks:
arithmetic operators on tensors in host code (types are unknown statically), scalars
read out of tensors (`float(t[i])`), state kept through aliases or in tensors, and
objects other than tensors and numbers passed to an interpreted kernel.
"""

from __future__ import annotations

import ast

from sandbox.gate.context import Violation
from sandbox.gate.module import check_module, kernel_names
from sandbox.gate.source_text import text_violations

__all__ = ["Violation", "check_module", "kernel_names", "text_violations", "violations"]


def violations(source: str | ast.Module, tree: ast.Module | None = None) -> list[Violation]:
    """Every violation in `source` (text that parses, with its `tree` if already parsed),
    by line. A parsed module alone gets the AST rules only: the text rules need the text."""
    if isinstance(source, ast.Module):
        return check_module(source)
    tree = ast.parse(source) if tree is None else tree
    found = text_violations(source, tree) + check_module(tree)
    return sorted(found, key=lambda v: v.line)
