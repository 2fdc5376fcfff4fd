"""Give a module's own top-level names a prefix, keeping its text, comments and layout.

Several candidate modules become one, and each defines its own kernels, helpers and
`triton_fused_operator`, often under the same names. Every name the module binds at top
level (functions, classes, assignments; imports are shared and kept) gets a prefix, and so
does every reference to it: at top level, and inside functions wherever the name is not a
local of that function (a kernel parameter called like a global constant stays itself).
The edit is made on the source text at the positions the parser reports, so the kernels
read as their author wrote them; the result is parsed again and checked.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class RenameError(ValueError):
    """The module holds a construct whose names cannot be prefixed safely."""


@dataclass(frozen=True)
class Renamed:
    source: str
    names: dict[str, str]  # old top-level name -> new


def top_level_names(tree: ast.Module) -> list[str]:
    """Names the module binds at top level, imports excepted, in order of first binding."""
    names: list[str] = []

    def add(name: str) -> None:
        if name not in names:
            names.append(name)

    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            continue
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            add(stmt.name)
            continue
        for node in _walk_scope(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                add(node.id)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                raise RenameError(f"line {node.lineno}: a top-level `except ... as` name")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                add(node.name)
    return names


def import_names(tree: ast.Module) -> set[str]:
    """Names the module's top-level imports bind."""
    bound: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            for alias in stmt.names:
                if alias.name == "*":
                    raise RenameError(f"line {stmt.lineno}: `import *` hides what it binds")
                bound.add(alias.asname or alias.name.split(".")[0])
    return bound


def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """`node` and what it contains in the same scope (not inside functions, lambdas,
    classes or comprehensions, though their names and the decorators, defaults and
    annotations evaluated outside them are included)."""
    yield node
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        outside = [*node.decorator_list, *_defaults(node.args), *_annotations(node)]
        for child in outside:
            yield from _walk_scope(child)
        return
    if isinstance(node, ast.Lambda):
        for child in _defaults(node.args):
            yield from _walk_scope(child)
        return
    if isinstance(node, ast.ClassDef):
        for child in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            yield from _walk_scope(child)
        return
    if isinstance(node, _COMPREHENSIONS):
        yield from _walk_scope(node.generators[0].iter)
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk_scope(child)


def _defaults(args: ast.arguments) -> list[ast.expr]:
    return [*args.defaults, *(d for d in args.kw_defaults if d is not None)]


def _annotations(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    args = fn.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    found = [a.annotation for a in every if a.annotation is not None]
    return found + ([fn.returns] if fn.returns is not None else [])


def _scope_body(node: ast.AST) -> list[ast.AST]:
    """What runs inside a function-like scope (its own body, not what is evaluated outside)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return list(node.body)
    if isinstance(node, ast.Lambda):
        return [node.body]
    if isinstance(node, ast.ClassDef):
        return list(node.body)
    if isinstance(node, _COMPREHENSIONS):
        parts: list[ast.AST] = []
        for k, gen in enumerate(node.generators):
            parts += [gen.target, *gen.ifs] + ([gen.iter] if k else [])
        if isinstance(node, ast.DictComp):
            return parts + [node.key, node.value]
        return parts + [node.elt]
    raise TypeError(type(node).__name__)


def _locals(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names local to the scope `node` opens, names it declares `global`)."""
    local: set[str] = set()
    declared: set[str] = set()
    if isinstance(node, _FUNCTION_SCOPES):
        args = node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        local |= {a.arg for a in every}
    for part in _scope_body(node):
        for inner in _walk_scope(part):
            if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store | ast.Del):
                local.add(inner.id)
            elif isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                local.add(inner.name)
            elif isinstance(inner, ast.Import | ast.ImportFrom):
                local |= {a.asname or a.name.split(".")[0] for a in inner.names}
            elif isinstance(inner, ast.ExceptHandler) and inner.name:
                local.add(inner.name)
            elif isinstance(inner, ast.Global):
                declared |= set(inner.names)
            elif isinstance(inner, ast.Nonlocal):
                local |= set(inner.names)
    return local - declared, declared


class _Collector:
    """Positions (line, byte column, old, new) of every token to rename."""

    def __init__(self, names: dict[str, str], lines: list[bytes]) -> None:
        self.names = names
        self.lines = lines
        self.edits: list[tuple[int, int, str, str]] = []

    def run(self, tree: ast.Module) -> None:
        for stmt in tree.body:
            self._visit(stmt, [])

    def _global(self, name: str, stack: list[tuple[set[str], bool]]) -> bool:
        """Whether `name`, read in the innermost scope of `stack`, is the module's."""
        for depth, (local, is_class) in enumerate(reversed(stack)):
            if is_class and depth > 0:
                continue  # a class body's names are not visible in its methods
            if name in local:
                return False
        return True

    def _visit(self, node: ast.AST, stack: list[tuple[set[str], bool]]) -> None:
        opens = isinstance(node, (*_FUNCTION_SCOPES, ast.ClassDef, *_COMPREHENSIONS))
        defines = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        if defines and node.name in self.names and self._global(node.name, stack):
            self._definition(node)
        if isinstance(node, ast.Name) and node.id in self.names and self._global(node.id, stack):
            self.edits.append((node.lineno, node.col_offset, node.id, self.names[node.id]))
        if isinstance(node, ast.Global):
            self._global_statement(node)
        if not opens:
            for child in ast.iter_child_nodes(node):
                self._visit(child, stack)
            return
        for part in _walk_outside(node):
            self._visit(part, stack)
        local, _ = _locals(node)
        inner = [*stack, (local, isinstance(node, ast.ClassDef))]
        for part in _scope_body(node):
            self._visit(part, inner)

    def _definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for token in self._tokens(node.lineno, node.lineno):
            if token.type == tokenize.NAME and token.string == node.name:
                line, col = token.start
                self.edits.append(
                    (line, self._byte_col(line, col), node.name, self.names[node.name])
                )
                return
        raise RenameError(f"line {node.lineno}: cannot find the name of `{node.name}`")

    def _global_statement(self, node: ast.Global) -> None:
        for token in self._tokens(node.lineno, node.end_lineno or node.lineno):
            if token.type == tokenize.NAME and token.string in set(node.names) & set(self.names):
                line, col = token.start
                edit = (line, self._byte_col(line, col), token.string, self.names[token.string])
                self.edits.append(edit)

    def _tokens(self, first: int, last: int) -> list[tokenize.TokenInfo]:
        text = b"".join(self.lines[first - 1 : last]).decode()
        found = []
        try:
            for token in tokenize.generate_tokens(io.StringIO(text).readline):
                line, col = token.start
                found.append(token._replace(start=(line + first - 1, col)))
        except (tokenize.TokenError, SyntaxError):
            pass  # a statement cut mid-bracket: the tokens before the cut are enough
        return found

    def _byte_col(self, line: int, col: int) -> int:
        return len(self.lines[line - 1].decode()[:col].encode())


def _walk_outside(node: ast.AST) -> list[ast.AST]:
    """The parts of a scope-opening node evaluated in the enclosing scope."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return [*node.decorator_list, *_defaults(node.args), *_annotations(node)]
    if isinstance(node, ast.Lambda):
        return list(_defaults(node.args))
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
    if isinstance(node, _COMPREHENSIONS):
        return [node.generators[0].iter]
    return []


def prefix_names(source: str, prefix: str) -> Renamed:
    """`source` with each top-level name (imports excepted) given `prefix`."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise RenameError(f"the module does not parse: line {err.lineno}: {err.msg}") from None
    own = top_level_names(tree)
    shared = import_names(tree)
    names = {name: f"{prefix}{name}" for name in own if name not in shared}
    lines = source.encode().splitlines(keepends=True)
    collector = _Collector(names, lines)
    collector.run(tree)
    patched = list(lines)
    for line, col, old, new in sorted(set(collector.edits), reverse=True):
        text = patched[line - 1]
        if text[col : col + len(old.encode())] != old.encode():
            raise RenameError(f"line {line}: `{old}` is not where the parser put it")
        patched[line - 1] = text[:col] + new.encode() + text[col + len(old.encode()) :]
    result = b"".join(patched).decode()
    try:
        renamed_tree = ast.parse(result)
    except SyntaxError as err:  # pragma: no cover - a position the parser misreported
        raise RenameError(f"renaming broke the module: line {err.lineno}: {err.msg}") from None
    expected = [names.get(n, n) for n in own]
    if top_level_names(renamed_tree) != expected:
        raise RenameError("renaming changed which names the module binds")
    return Renamed(result, names)
