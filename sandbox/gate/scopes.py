"""Which binding a name in a candidate's source refers to, by Python's scoping rules.

The gate judges `torch.matmul` by what `torch` is: an imported module, a local variable,
a builtin. A wrong answer here would let a refused builtin through under a local's name
(`[sorted(p, key=open) for open in [open]]`), so this follows Python: function scopes
see their own bindings, then enclosing functions' (never a class body's), then the
module's, then builtins; a comprehension's first iterable belongs to the enclosing scope.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

ScopeNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass
class Scope:
    """Names bound in one function, lambda or comprehension, and which of them are defs."""

    names: set[str] = field(default_factory=set)
    defs: set[str] = field(default_factory=set)


def parameters(args: ast.arguments) -> list[ast.arg]:
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return every


def _own_nodes(nodes: list[ast.AST]) -> Iterator[ast.AST]:
    """Nodes evaluated in this scope: nested scopes contribute their names (a def's name,
    a comprehension's first iterable and walrus targets) but not their bodies."""
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            # decorators, defaults and annotations run in the enclosing scope
            outer: list[ast.AST] = list(node.decorator_list)
            if isinstance(node, ast.ClassDef):
                outer += [*node.bases, *node.keywords]
            else:
                outer += [*node.args.defaults, *node.args.kw_defaults]
                outer += [a.annotation for a in parameters(node.args) if a.annotation]
                outer += [node.returns] if node.returns else []
            stack.extend(reversed([n for n in outer if n is not None]))
        elif isinstance(node, ast.Lambda):
            defaults = [*node.args.defaults, *node.args.kw_defaults]
            stack.extend(reversed([n for n in defaults if n is not None]))
        elif isinstance(node, COMPREHENSIONS):
            stack.append(node.generators[0].iter)
            stack.extend(_walrus_targets(node))
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _walrus_targets(comprehension: ast.AST) -> Iterator[ast.Name]:
    """Walrus targets inside a comprehension (and comprehensions nested in it): they bind
    in the enclosing function. Lambdas and defs inside keep theirs."""
    stack = list(ast.iter_child_nodes(comprehension))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            yield node.target
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _bound_by(nodes: list[ast.AST], scope: Scope) -> Scope:
    assigned: set[str] = set()
    for node in _own_nodes(nodes):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            scope.names.add(node.id)
            assigned.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope.names.add(node.name)
            if not isinstance(node, ast.ClassDef):
                scope.defs.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                scope.names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            scope.names.add(node.name)
    scope.defs -= assigned  # a def rebound to a value is a variable
    return scope


def function_scope(node: ScopeNode) -> Scope:
    """The names a function or lambda binds: its parameters and what its body assigns."""
    scope = Scope(names={a.arg for a in parameters(node.args)})
    body: list[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
    return _bound_by(body, scope)


def comprehension_scope(
    node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp,
) -> Scope:
    """The names a comprehension binds: its loop targets."""
    scope = Scope()
    for generator in node.generators:
        for name in ast.walk(generator.target):
            if isinstance(name, ast.Name):
                scope.names.add(name.id)
    return scope
