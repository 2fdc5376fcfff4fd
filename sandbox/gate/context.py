"""Where code runs, as the static gate sees it, and what it learned about the module.

A context says where code runs: `module` (at import: constants and decorators), `host`
(functions and ModelNew methods, with the runtime poisoning around them), `callback`
(lambdas and functions handed to someone else as values, e.g. a launch grid: Triton calls
them inside the launch, where the poisoning is set aside, so they may only compute values)
or `kernel` (a @triton.jit body, checked against the Triton language).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from sandbox.gate.scopes import Scope


@dataclass(frozen=True, order=True)
class Violation:
    """One refused construct: its line and what it is."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ModuleInfo:
    """What the module's top level binds, and which functions are handed out as values."""

    aliases: dict[str, str] = field(default_factory=dict)  # name -> canonical dotted path
    kernels: set[str] = field(default_factory=set)
    functions: set[str] = field(default_factory=set)
    classes: set[str] = field(default_factory=set)
    constants: set[str] = field(default_factory=set)
    model_methods: set[str] = field(default_factory=set)
    model_attributes: set[str] = field(default_factory=set)  # `self.X = ...` in ModelNew
    callbacks: set[str] = field(default_factory=set)  # defs used as values
    method_callbacks: set[str] = field(default_factory=set)  # `self.method` used as a value
    setup_methods: set[str] = field(default_factory=set)  # run only from ModelNew.__init__
    mutables: set[str] = field(default_factory=set)  # module-level containers
    read_only_uses: set[int] = field(default_factory=set)  # ids of Name nodes that only read
    refused_aliases: set[str] = field(default_factory=set)  # bound by a refused import


@dataclass(frozen=True)
class Context:
    kind: str  # "module", "host", "callback" or "kernel"
    self_scope: Scope | None = None  # a ModelNew method's scope (its first parameter is self)
    self_name: str = ""
    init: bool = False  # ModelNew.__init__: parameter set-up may use PyTorch


MODULE_LEVEL = Context("module")
WHERE = {
    "module": "at module level",
    "host": "in host code",
    "callback": "in a callback",
    "kernel": "in a @triton.jit kernel",
}
CONSTRUCTS = {
    ast.AsyncFunctionDef: "async def",
    ast.AsyncFor: "async for",
    ast.AsyncWith: "async with",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.Global: "global",
    ast.Nonlocal: "nonlocal",
    ast.Try: "try/except",
    ast.TryStar: "try/except*",
    ast.Match: "match",
    ast.ClassDef: "class",
    ast.Import: "import",
    ast.ImportFrom: "import",
    ast.Lambda: "lambda",
    ast.Raise: "raise",
    ast.With: "with",
    ast.Delete: "del",
    ast.FunctionDef: "def",
    ast.For: "for",
    ast.While: "while",
    ast.If: "if",
    ast.Expr: "expression statement",
    ast.Assign: "assignment",
    ast.Dict: "dict",
    ast.Set: "set",
    ast.NamedExpr: "walrus (:=)",
    ast.GeneratorExp: "generator expression",
    ast.SetComp: "set comprehension",
    ast.DictComp: "dict comprehension",
}


def construct(node: ast.AST) -> str:
    return CONSTRUCTS.get(type(node), type(node).__name__)
