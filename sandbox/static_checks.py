"""Checks on a candidate's source before anything runs (DESIGN §4, check 1).

In order: size, parse, the entry point, at least one Triton kernel, then the static gate
(`sandbox.gate`): host code and kernel bodies checked against the allowlist. A refusal
is the `disallowed_code` verdict, its message naming the first constructs and their lines.
"""

from __future__ import annotations

import ast

from sandbox.gate import kernel_names, violations

MAX_SOURCE_BYTES = 2 * 2**20
# Violations quoted in a refusal's message (the rest are counted).
MAX_VIOLATIONS_SHOWN = 5


def _is_triton_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr in ("jit", "autotune", "heuristics") and (
            isinstance(target.value, ast.Name) and target.value.id == "triton"
        )
    return isinstance(target, ast.Name) and target.id in ("jit", "triton_jit")


def gate_message(source: str, tree: ast.Module) -> str | None:
    """Why the gate refuses a candidate (`source`, parsed as `tree`), or None."""
    found = violations(source, tree)
    if not found:
        return None
    shown = "; ".join(str(v) for v in found[:MAX_VIOLATIONS_SHOWN])
    more = len(found) - MAX_VIOLATIONS_SHOWN
    return f"the static gate refuses: {shown}" + (f" (and {more} more)" if more > 0 else "")


def static_verdict(source: str, fmt: str, gate: bool = True) -> tuple[str, str] | None:
    """(verdict, message) when the source fails a static check, else None.

    `gate=False` skips the allowlist gate (the other checks stay): only for tests of the
    defences behind it, never for serving.
    """
    try:
        size = len(source.encode())
    except UnicodeEncodeError:  # lone surrogates: no file or request can carry this text
        return "syntax_error", "the source is not valid Unicode text (a lone surrogate)"
    if size > MAX_SOURCE_BYTES:
        return "resource_limit", f"candidate source is larger than {MAX_SOURCE_BYTES} bytes"
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return "syntax_error", f"line {err.lineno}: {err.msg}"
    except (ValueError, RecursionError, MemoryError) as err:  # NUL bytes, absurd nesting
        return "syntax_error", f"the source does not parse: {type(err).__name__}"
    entry = "ModelNew" if fmt == "kernelbench" else "triton_fused_operator"
    defined = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }
    assigned = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    if entry not in defined | assigned:
        return "no_entry_point", f"the candidate defines no {entry}"
    kernels = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any(map(_is_triton_decorator, node.decorator_list))
    ]
    if not kernels and not kernel_names(tree):
        return "no_triton_kernel", "the candidate defines no @triton.jit kernel"
    if not gate:
        return None
    try:
        message = gate_message(source, tree)
    except RecursionError:
        message = "the static gate refuses: the source nests too deeply to check"
    if message is not None:
        return "disallowed_code", message
    return None
