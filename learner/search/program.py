"""A functional-format problem as a straight line of values (pure `ast`, no torch).

Search cuts a program between operators, so it needs the program as data: which value
each line defines and which earlier values it reads. Values are numbered as the generator
numbers its tensors, inputs first and then one per line, and every value is called
`tensor_N` by its number whatever the source called it, so a program that reuses a name
(`t = torch.relu(t)`) or uses free names cuts just like a generated one. Module-level
statements other than `get_inputs` and `fused_operator` (imports, constants, helpers) are
kept as the program's header.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass


class SearchError(ValueError):
    """The problem cannot be searched; the message is one line naming the cause."""


@dataclass(frozen=True)
class Step:
    """One line of `fused_operator`: value `value` is `expr` over earlier values."""

    value: int
    expr: ast.expr  # tensors appear as `tensor_N` (canonical names)
    reads: tuple[int, ...]  # values it reads, in order of first use
    line: int  # the line in the problem's source

    def text(self, names: Mapping[int, str] | None = None) -> str:
        """`expr` as source, each value called `names[v]` (its canonical name by default)."""
        return render(self.expr, names)

    def statement(self, names: Mapping[int, str] | None = None) -> str:
        target = names[self.value] if names is not None else value_name(self.value)
        return f"{target} = {self.text(names)}"


@dataclass(frozen=True)
class StraightLine:
    """A parsed problem: its header, inputs, one step per operator, returned values."""

    source: str
    header: tuple[ast.stmt, ...]
    get_inputs: ast.FunctionDef
    n_inputs: int
    steps: tuple[Step, ...]
    returns: tuple[int, ...]

    @property
    def n_ops(self) -> int:
        return len(self.steps)

    @property
    def n_values(self) -> int:
        return self.n_inputs + len(self.steps)

    def step_of(self, value: int) -> int | None:
        """The index of the step defining `value` (None for an input)."""
        return value - self.n_inputs if value >= self.n_inputs else None

    def header_names(self) -> set[str]:
        """Every name the header binds or mentions (to keep new names clear of them)."""
        names = {self.get_inputs.name}
        for node in ast.walk(ast.Module(body=list(self.header), type_ignores=[])):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
        return names


def value_name(value: int) -> str:
    return f"tensor_{value}"


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            return ast.copy_location(ast.Name(id=self.names[node.id], ctx=node.ctx), node)
        return node


def render(expr: ast.expr, names: Mapping[int, str] | None = None) -> str:
    """An expression over canonical value names as source, values renamed by `names`."""
    if names is None:
        return ast.unparse(expr)
    mapping = {value_name(v): name for v, name in names.items()}
    return ast.unparse(_Rename(mapping).visit(_copy(expr)))


def _copy(expr: ast.expr) -> ast.expr:
    return ast.parse(ast.unparse(expr), mode="eval").body


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not found:
        raise SearchError(f"the problem defines no {name}() (functional format expected)")
    return found[-1]


def _arguments(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg or args.defaults:
        raise SearchError("fused_operator must take plain positional arguments only")
    return [a.arg for a in args.args]


def _returned(node: ast.expr | None, line: int) -> list[ast.expr]:
    if node is None:
        raise SearchError(f"line {line}: fused_operator returns nothing")
    if isinstance(node, ast.List | ast.Tuple):
        return list(node.elts)
    return [node]


class _Reads(ast.NodeVisitor):
    """Tensor names an expression reads, resolved to values; the rest must be globals."""

    def __init__(self, env: dict[str, int], locals_: set[str], line: int) -> None:
        self.env = env
        self.locals = locals_
        self.line = line
        self.values: list[int] = []

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.env:
            value = self.env[node.id]
            if value not in self.values:
                self.values.append(value)
        elif node.id in self.locals:
            raise SearchError(f"line {self.line}: `{node.id}` is used before it is defined")

    def visit_Lambda(self, node: ast.Lambda) -> None:
        raise SearchError(f"line {self.line}: lambdas are not supported in fused_operator")

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        raise SearchError(f"line {self.line}: `:=` is not supported in fused_operator")


def _canonical(expr: ast.expr, env: dict[str, int]) -> ast.expr:
    return _Rename({name: value_name(v) for name, v in env.items()}).visit(_copy(expr))


def _local_names(fn: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in fn.args.args}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def parse(source: str) -> StraightLine:
    """The straight line of a functional-format problem; `SearchError` naming the line
    when it is not one (control flow, several targets, an undefined name)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise SearchError(f"the problem does not parse: line {err.lineno}: {err.msg}") from None
    get_inputs = _function(tree, "get_inputs")
    operator = _function(tree, "fused_operator")
    header = tuple(n for n in tree.body if n is not get_inputs and n is not operator)
    header = tuple(
        n
        for n in header
        if not (isinstance(n, ast.FunctionDef) and n.name in ("get_inputs", "fused_operator"))
    )
    inputs = _arguments(operator)
    locals_ = _local_names(operator)
    taken_globals = {
        node.id
        for node in ast.walk(operator)
        if isinstance(node, ast.Name) and node.id not in locals_
    }
    clash = sorted(n for n in taken_globals if n.startswith("tensor_") and n[7:].isdigit())
    if clash:
        raise SearchError(f"fused_operator reads a global named {clash[0]}, a name search uses")
    env = {name: i for i, name in enumerate(inputs)}
    if len(env) != len(inputs):
        raise SearchError("fused_operator repeats an argument name")
    body = list(operator.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # a docstring
    if not body or not isinstance(body[-1], ast.Return):
        raise SearchError("fused_operator must end with `return [...]`")
    steps: list[Step] = []
    for stmt in body[:-1]:
        target, value = _assignment(stmt)
        reads = _Reads(env, locals_, stmt.lineno)
        reads.visit(value)
        index = len(inputs) + len(steps)
        steps.append(Step(index, _canonical(value, env), tuple(reads.values), stmt.lineno))
        env[target] = index
    returns: list[int] = []
    ret = body[-1]
    assert isinstance(ret, ast.Return)
    for node in _returned(ret.value, ret.lineno):
        if isinstance(node, ast.Name) and node.id in env:
            returns.append(env[node.id])
        elif isinstance(node, ast.Name):
            raise SearchError(f"line {ret.lineno}: returns `{node.id}`, which is not a value")
        else:  # `return [torch.relu(t)]`: the expression is the last operator
            reads = _Reads(env, locals_, ret.lineno)
            reads.visit(node)
            index = len(inputs) + len(steps)
            steps.append(Step(index, _canonical(node, env), tuple(reads.values), ret.lineno))
            returns.append(index)
    if not steps:
        raise SearchError("fused_operator applies no operator")
    if not returns:
        raise SearchError("fused_operator returns an empty list")
    return StraightLine(source, header, get_inputs, len(inputs), tuple(steps), tuple(returns))


def _assignment(stmt: ast.stmt) -> tuple[str, ast.expr]:
    """(target name, value) of `name = expr` or `name: T = expr`."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Name):
            return target.id, stmt.value
    if (
        isinstance(stmt, ast.AnnAssign)
        and stmt.value is not None
        and isinstance(stmt.target, ast.Name)
    ):
        return stmt.target.id, stmt.value
    raise SearchError(
        f"line {stmt.lineno}: expected one `name = operator(...)` per line, "
        f"got `{ast.unparse(stmt).splitlines()[0]}`"
    )
