"""The static gate's rules for statements: what a function body may do, and assignments.

Host code may assign locals, items of local containers and (in ModelNew's set-up)
attributes of self; loop, branch, assert and raise; enter the listed context managers.
A kernel body may only use what Triton compiles.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from sandbox.gate import policy as P
from sandbox.gate.context import MODULE_LEVEL, Context, construct
from sandbox.gate.expressions import ExpressionRules
from sandbox.gate.scopes import COMPREHENSIONS, Scope, function_scope, parameters

_KERNEL_STATEMENTS = (
    ast.Return, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While, ast.If,
    ast.Expr, ast.Pass, ast.Break, ast.Continue, ast.Assert,
)  # fmt: skip
_KERNEL_LOOPS = frozenset({"range", "triton.language.range", "triton.language.static_range"})


class Rules(ExpressionRules):
    """Checks statements (and, through ExpressionRules, expressions)."""

    def body(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self.stmt(statement)

    def stmt(self, node: ast.stmt) -> None:
        kernel = self.ctx.kind == "kernel"
        if kernel and not isinstance(node, _KERNEL_STATEMENTS):
            self.refuse(node, f"'{construct(node)}' is not allowed {self.where}")
            return
        if isinstance(node, ast.Expr | ast.Return):
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self.target(target)
            self.expr(node.value)
        elif isinstance(node, ast.AugAssign):
            if kernel and isinstance(node.op, ast.MatMult):
                self.refuse(node, f"'@=' is not allowed {self.where} (tl.dot multiplies tiles)")
            self.target(node.target, augmented=True)
            self.expr(node.value)
        elif isinstance(node, ast.AnnAssign):
            self.annotation(node.annotation)
            self.target(node.target)
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.For):
            self.loop_iterable(node.iter)
            self.target(node.target)
            self.body(node.body)
            self.body(node.orelse)
        elif isinstance(node, ast.While | ast.If):
            self.expr(node.test)
            self.body(node.body)
            self.body(node.orelse)
        elif isinstance(node, ast.Assert):
            self.expr(node.test)
            if node.msg is not None:
                self.expr(node.msg)
        elif isinstance(node, ast.Raise):
            for part in (node.exc, node.cause):
                if part is not None:
                    self.expr(part)
        elif isinstance(node, ast.With):
            self.with_(node)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if not (isinstance(target, ast.Name) and self.resolve(target.id) == "local"):
                    self.refuse(target, "'del' is only allowed on local variables")
        elif isinstance(node, ast.FunctionDef):
            self.nested_function(node)
        elif not isinstance(node, ast.Pass | ast.Break | ast.Continue):
            self.refuse(node, f"'{construct(node)}' is not allowed {self.where}")
            self.inner_statements(node)

    def inner_statements(self, node: ast.stmt) -> None:
        """The statements inside a refused one (try, match, ...), so every violation shows."""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        blocks = [getattr(node, name, []) for name in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(node, "handlers", [])]
        blocks += [c.body for c in getattr(node, "cases", [])]
        for block in blocks:
            self.body([s for s in block if isinstance(s, ast.stmt)])

    def loop_iterable(self, node: ast.expr) -> None:
        if self.ctx.kind == "kernel":
            func = node.func if isinstance(node, ast.Call) else None
            if func is None or self.path_of(func) not in _KERNEL_LOOPS:
                self.refuse(
                    node, "a kernel's for loop must run over range, tl.range or tl.static_range"
                )
                return
        self.expr(node)

    def with_(self, node: ast.With) -> None:
        if self.ctx.kind == "callback":
            self.refuse(node, f"'with' is not allowed {self.where}")
            return
        for item in node.items:
            call = item.context_expr
            path = self.path_of(call.func) if isinstance(call, ast.Call) else None
            if path not in P.CONTEXT_MANAGERS:
                self.refuse(
                    call,
                    f"context manager '{ast.unparse(call)}' is not allowed "
                    f"(only {', '.join(sorted(P.CONTEXT_MANAGERS))})",
                )
                continue
            assert isinstance(call, ast.Call)
            self.arguments(call)
            if item.optional_vars is not None:
                self.target(item.optional_vars)
        self.body(node.body)

    def nested_function(self, node: ast.FunctionDef) -> None:
        if node.decorator_list:
            self.refuse(node, f"decorators on the nested function '{node.name}' are not allowed")
        callback = node.name in self.info.callbacks or self.ctx.kind == "callback"
        ctx = self.callback_context() if callback else self.ctx
        self.function_body(node, replace(ctx, init=False) if callback else ctx)

    def function_body(
        self, node: ast.FunctionDef, ctx: Context, scope: Scope | None = None
    ) -> None:
        """Defaults and annotations (evaluated where the def is), then the body."""
        self.signature(node)
        with self.entering(ctx, scope or function_scope(node)):
            self.body(node.body)

    def signature(self, node: ast.FunctionDef | ast.Lambda) -> None:
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is None:
                continue
            if isinstance(default, (ast.List, ast.Dict, ast.Set, *COMPREHENSIONS)):
                self.refuse(
                    default, "a mutable default argument is not allowed (state across calls)"
                )
                continue
            with self.entering(replace(MODULE_LEVEL, self_scope=None)):
                self.expr(default)
        if isinstance(node, ast.FunctionDef):
            for arg in parameters(node.args):
                if arg.arg.startswith("__"):
                    self.refuse(arg, f"parameter '{arg.arg}' is not allowed (dunder names)")
                if arg.annotation is not None:
                    self.annotation(arg.annotation)
            if node.returns is not None:
                self.annotation(node.returns)

    def annotation(self, node: ast.expr) -> None:
        with self.entering(MODULE_LEVEL if self.ctx.kind != "kernel" else self.ctx):
            self.expr(node)

    # -- assignment targets ---------------------------------------------------------------
    def target(self, node: ast.expr, augmented: bool = False) -> None:
        kind = self.ctx.kind
        if isinstance(node, ast.Name):
            if node.id.startswith("__"):
                self.refuse(node, f"name '{node.id}' is not allowed (dunder names)")
            elif self.is_self(node.id):
                self.refuse(node, f"rebinding '{node.id}' (ModelNew's self) is not allowed")
        elif isinstance(node, ast.Tuple | ast.List):
            if kind == "kernel" and isinstance(node, ast.List):
                self.refuse(node, f"assigning to a list is not allowed {self.where}")
            for element in node.elts:
                self.target(element)
        elif isinstance(node, ast.Starred):
            self.target(node.value)
        elif isinstance(node, ast.Attribute):
            self.attribute_target(node, augmented)
        elif isinstance(node, ast.Subscript):
            base = node.value
            if kind in ("kernel", "callback", "module"):
                self.refuse(node, f"assigning to an item is not allowed {self.where}")
            elif self.module_level_root(base):
                self.refuse(
                    node,
                    f"writing into module-level '{ast.unparse(base)}' from a function is not "
                    "allowed (no state across calls)",
                )
            elif self.on_self(base) and not self.ctx.init:
                self.refuse(
                    node,
                    f"writing into '{ast.unparse(base)}' outside ModelNew.__init__ "
                    "is not allowed (no state across calls)",
                )
            else:
                self.expr(base)
                self.expr(node.slice)
        else:
            self.refuse(node, f"assigning to '{ast.unparse(node)}' is not allowed")

    def attribute_target(self, node: ast.Attribute, augmented: bool) -> None:
        base = node.value
        if not (isinstance(base, ast.Name) and self.is_self(base.id)) or self.ctx.kind != "host":
            self.refuse(
                node,
                f"assigning to attribute '{ast.unparse(node)}' is not allowed "
                "(only self.<name> = ... in ModelNew.__init__: no monkey-patching)",
            )
        elif augmented:
            self.refuse(
                node, f"augmented assignment to attribute '{ast.unparse(node)}' is not allowed"
            )
        elif not self.ctx.init:
            self.refuse(
                node,
                f"assigning '{ast.unparse(node)}' outside ModelNew.__init__ is not "
                "allowed (no state across calls)",
            )
        elif node.attr.startswith("__"):
            self.refuse(node, f"attribute '{node.attr}' is not allowed (dunder names)")
        elif node.attr in P.NN_MODULE_ATTRIBUTES:
            self.refuse(
                node, f"assigning 'self.{node.attr}' would replace nn.Module's own machinery"
            )
