"""Checks on a candidate's source before anything runs (DESIGN §4, check 1)."""

from __future__ import annotations

import ast

MAX_SOURCE_BYTES = 2 * 2**20


def _is_triton_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr in ("jit", "autotune", "heuristics") and (
            isinstance(target.value, ast.Name) and target.value.id == "triton"
        )
    return isinstance(target, ast.Name) and target.id in ("jit", "triton_jit")


def static_verdict(source: str, fmt: str) -> tuple[str, str] | None:
    """(verdict, message) when the source fails a static check, else None."""
    if len(source.encode()) > MAX_SOURCE_BYTES:
        return "resource_limit", f"candidate source is larger than {MAX_SOURCE_BYTES} bytes"
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return "syntax_error", f"line {err.lineno}: {err.msg}"
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
    if not kernels:
        return "no_triton_kernel", "the candidate defines no @triton.jit kernel"
    return None
