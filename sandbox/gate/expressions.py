"""The static gate's rules for expressions: names, paths, attributes, calls.

The gate cannot know a value's type, so what a value may do is judged by name: a path
from an import (`torch.empty`) against the allowlists, an attribute of any other value
(`x.view`, `self.weight`) against the value lists, a call against what may be called in
the current context (`sandbox.gate.context`).
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Iterator
from dataclasses import replace

from sandbox.gate import policy as P
from sandbox.gate.context import MODULE_LEVEL, WHERE, Context, ModuleInfo, Violation, construct
from sandbox.gate.scopes import COMPREHENSIONS, Scope, comprehension_scope, function_scope

# Expression node types every context allows (operands are checked one by one).
_PLAIN = (
    ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Compare, ast.Constant, ast.List,
    ast.Tuple, ast.Slice, ast.JoinedStr, ast.FormattedValue, ast.Starred,
)  # fmt: skip
_HOST_ONLY = (ast.Dict, ast.Set, ast.NamedExpr, ast.Lambda, *COMPREHENSIONS)


def refused_reason(parts: list[str]) -> str:
    """Why a refused path is refused, where the policy says (`REFUSED_REASONS`)."""
    for end in range(len(parts), 0, -1):
        reason = P.REFUSED_REASONS.get(".".join(parts[:end]))
        if reason:
            return reason
    return ""


class ExpressionRules:
    """Checks expressions in the current context and scopes; collects every violation."""

    def __init__(self, info: ModuleInfo) -> None:
        self.info = info
        self.ctx = MODULE_LEVEL
        self.scopes: list[Scope] = []
        self.violations: list[Violation] = []

    # -- bookkeeping ------------------------------------------------------------------------
    def refuse(self, node: ast.AST, message: str) -> None:
        self.violations.append(Violation(getattr(node, "lineno", 0), message))

    @contextlib.contextmanager
    def entering(self, ctx: Context | None = None, scope: Scope | None = None) -> Iterator[None]:
        saved = self.ctx
        self.ctx = ctx or self.ctx
        if scope is not None:
            self.scopes.append(scope)
        try:
            yield
        finally:
            self.ctx = saved
            if scope is not None:
                self.scopes.pop()

    def resolve(self, name: str) -> str:
        """What a loaded name refers to: local, def (a local function), alias (an imported
        module or object), kernel, function, class, constant, builtin or unknown."""
        for scope in reversed(self.scopes):
            if name in scope.names:
                return "def" if name in scope.defs else "local"
        info = self.info
        for kind, names in (
            ("alias", info.aliases),
            ("kernel", info.kernels),
            ("function", info.functions),
            ("class", info.classes),
            ("constant", info.constants),
        ):
            if name in names:
                return kind
        return "builtin" if name in P.BUILTIN_NAMES else "unknown"

    def is_self(self, name: str) -> bool:
        """Whether `name` is the current ModelNew method's own first parameter."""
        if self.ctx.self_scope is None or name != self.ctx.self_name:
            return False
        innermost = next((s for s in reversed(self.scopes) if name in s.names), None)
        return innermost is self.ctx.self_scope

    def path_of(self, node: ast.expr) -> str | None:
        """The canonical dotted path of `alias.attr...`, or None for anything else."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and self.resolve(node.id) == "alias":
            return ".".join([self.info.aliases[node.id], *reversed(parts)])
        if isinstance(node, ast.Name) and not parts and self.resolve(node.id) == "builtin":
            return node.id
        return None

    def callback_context(self) -> Context:
        return replace(self.ctx, kind="callback", init=False)

    @property
    def where(self) -> str:
        return WHERE[self.ctx.kind]

    # -- provided by the statement rules ----------------------------------------------------
    def target(self, node: ast.expr, augmented: bool = False) -> None:
        raise NotImplementedError

    def signature(self, node: ast.FunctionDef | ast.Lambda) -> None:
        raise NotImplementedError

    # -- expressions ------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> None:
        kernel = self.ctx.kind == "kernel"
        if isinstance(node, ast.Name):
            self.name(node, call=False)
        elif isinstance(node, ast.Attribute):
            self.attribute(node, call=False)
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.Subscript):
            self.expr(node.value)
            self.expr(node.slice)
        elif kernel and isinstance(node, ast.ListComp) and len(node.generators) == 1:
            self.comprehension(node)
        elif kernel and isinstance(node, _HOST_ONLY):
            self.refuse(node, f"'{construct(node)}' is not allowed {self.where}")
        elif kernel and isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            # Triton tensors have no `@`: only objects smuggled in would (use tl.dot)
            self.refuse(node, f"'@' is not allowed {self.where} (tl.dot multiplies tiles)")
            self.expr(node.left)
            self.expr(node.right)
        elif isinstance(node, ast.Lambda):
            self.lambda_(node)
        elif isinstance(node, COMPREHENSIONS):
            self.comprehension(node)
        elif isinstance(node, ast.NamedExpr) and self.ctx.kind == "module":
            self.refuse(node, "a walrus (:=) is not allowed at module level")
        elif isinstance(node, ast.NamedExpr):
            self.target(node.target)
            self.expr(node.value)
        elif isinstance(node, (*_PLAIN, ast.Dict, ast.Set)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)
        else:
            self.refuse(node, f"'{construct(node)}' is not allowed {self.where}")

    def lambda_(self, node: ast.Lambda) -> None:
        self.signature(node)
        with self.entering(self.callback_context(), function_scope(node)):
            self.expr(node.body)

    def comprehension(
        self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
    ) -> None:
        self.expr(node.generators[0].iter)  # evaluated in the enclosing scope
        with self.entering(scope=comprehension_scope(node)):
            for index, generator in enumerate(node.generators):
                if generator.is_async:
                    self.refuse(node, "'async for' is not allowed")
                self.target(generator.target)
                if index:
                    self.expr(generator.iter)
                for condition in generator.ifs:
                    self.expr(condition)
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for element in elements:
                self.expr(element)

    def arguments(self, node: ast.Call) -> None:
        for arg in node.args:
            self.expr(arg)
        for keyword in node.keywords:
            self.expr(keyword.value)

    def call(self, node: ast.Call) -> None:
        func = node.func
        if self.ctx.kind == "kernel" and self.path_of(func) == P.INLINE_ASM:
            self.inline_asm(node)
        if isinstance(func, ast.Name):
            self.name(func, call=True)
        elif isinstance(func, ast.Attribute):
            self.attribute(func, call=True)
        elif isinstance(func, ast.Subscript) and self.ctx.kind == "host" and self.is_launch(func):
            self.expr(func.slice)
        elif isinstance(func, ast.Subscript):
            self.refuse(
                node,
                f"calling '{ast.unparse(func)}' is not allowed {self.where} "
                "(only a module-level @triton.jit kernel is launched with [grid])",
            )
            self.expr(func)
        else:
            self.refuse(node, f"calling the result of '{ast.unparse(func)}' is not allowed")
            self.expr(func)
        self.arguments(node)

    def inline_asm(self, node: ast.Call) -> None:
        """`tl.inline_asm_elementwise`: its assembly a string literal, no clock read in it."""
        asm = node.args[0] if node.args else None
        asm = next((k.value for k in node.keywords if k.arg == "asm"), asm)
        if not (isinstance(asm, ast.Constant) and isinstance(asm.value, str)):
            self.refuse(node, "inline assembly must be a string literal")
        elif re.search(P.TIMER_REGISTERS, asm.value):
            self.refuse(
                node,
                "inline assembly may not read the GPU's clocks (%globaltimer, %clock): "
                "they tell timed calls apart",
            )

    def is_launch(self, func: ast.Subscript) -> bool:
        return isinstance(func.value, ast.Name) and self.resolve(func.value.id) == "kernel"

    def name(self, node: ast.Name, call: bool) -> None:
        name, ctx = node.id, self.ctx
        if name.startswith("__"):
            self.refuse(node, f"name '{name}' is not allowed (dunder names)")
            return
        kind = self.resolve(name)
        if kind == "alias":
            if name not in self.info.refused_aliases:  # its import line says why
                self.path(node, self.info.aliases[name].split("."), call)
            return
        if kind == "builtin":
            allowed = P.KERNEL_BUILTINS if ctx.kind == "kernel" else P.HOST_BUILTINS
            if name not in allowed:
                self.refuse(
                    node,
                    f"name '{name}' is not allowed {self.where} (builtins outside the allowlist)",
                )
            elif call and ctx.kind == "module" and name == "print":
                self.refuse(node, "calling 'print' is not allowed at module level")
            return
        if kind == "unknown" and isinstance(node.ctx, ast.Load):
            # A name bound nowhere in the file would come from globals someone else put in
            # the module at run time (Triton's interpreter adds its own): never the
            # candidate's code.
            self.refuse(node, f"name '{name}' is not defined in the candidate")
            return
        if ctx.kind == "kernel" and kind in ("function", "class"):
            self.refuse(node, f"host code '{name}' cannot be used in a @triton.jit kernel")
            return
        state = kind == "constant" and name in self.info.mutables and ctx.kind != "module"
        if state and id(node) not in self.info.read_only_uses:
            self.refuse(
                node,
                f"module-level container '{name}' may only be read in functions "
                "(indexed, iterated): no state across calls",
            )
            return
        if not call:
            return
        callable_here = {
            "module": (),
            "callback": (),
            "host": ("def", "function", "kernel"),
            "kernel": ("kernel",),
        }[ctx.kind]
        pure = kind in ("def", "function") and name in self.info.callbacks
        if kind not in callable_here and not (pure and ctx.kind in ("module", "callback")):
            self.refuse(
                node,
                f"calling '{name}' is not allowed {self.where} (only functions defined in the "
                "file, Triton kernels and allowlisted functions may be called there)",
            )

    def path(self, node: ast.AST, parts: list[str], call: bool) -> None:
        """`torch.x.y(...)`: the longest allowed prefix, then value attributes."""
        ctx = self.ctx
        if ctx.kind == "kernel":
            allowed = P.KERNEL_PATHS
        else:
            allowed = P.HOST_PATHS | (P.INIT_PATHS if ctx.init else frozenset())
        for end in range(len(parts), 0, -1):
            prefix = ".".join(parts[:end])
            if prefix in allowed:
                rest = parts[end:]
                if ctx.kind == "module" and call and not rest and prefix not in P.MODULE_CALLS:
                    self.refuse(
                        node,
                        f"calling '{prefix}' is not allowed at module level "
                        "(no side effects at import)",
                    )
                elif rest:
                    self.value_attributes(node, rest, call)
                return
        full = ".".join(parts)
        reason = refused_reason(parts)
        if reason:
            self.refuse(node, f"'{full}' is not allowed {self.where}: {reason}")
        elif full in P.NAMESPACES or full in P.IMPORTS:
            self.refuse(node, f"module '{full}' cannot be used as a value")
        elif ctx.kind == "kernel":
            self.refuse(
                node, f"'{full}' is not allowed in a @triton.jit kernel (only the Triton language)"
            )
        else:
            self.refuse(
                node,
                f"'{full}' is not allowed {self.where} (allowed: allocation, "
                "dtypes, views and shape queries; compute belongs in Triton kernels)",
            )

    def attribute(self, node: ast.Attribute, call: bool) -> None:
        parts: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            parts.append(base.attr)
            base = base.value
        parts.reverse()
        if self.is_super_init(base, parts, call):
            return
        path = self.path_of(node)
        self_base = isinstance(base, ast.Name) and self.is_self(base.id)
        for index, attr in enumerate(parts):
            if not attr.startswith("_"):
                continue
            own = self.info.model_attributes | self.info.model_methods
            private_self = self_base and index == 0 and attr in own
            exception = self.ctx.init and path in P.PRIVATE_PATH_EXCEPTIONS
            if attr.startswith("__") or not (private_self or exception):
                why = "dunder names" if attr.startswith("__") else "names starting with _"
                self.refuse(node, f"attribute access '{attr}' is not allowed ({why})")
                if not isinstance(base, ast.Name):
                    self.expr(base)
                elif self.resolve(base.id) != "alias":
                    self.name(base, call=False)
                return
        if isinstance(base, ast.Name):
            kind = self.resolve(base.id)
            if base.id.startswith("__"):
                self.name(base, call=False)
                return
            if kind == "class":
                # `ModelNew.method(self, ...)` would reach a set-up method from forward
                # past the gate's call graph: methods are called through self only.
                self.refuse(node, f"attributes of the class '{base.id}' are not allowed")
                return
            if kind == "alias" and path is not None:
                if base.id not in self.info.refused_aliases:
                    self.path(node, path.split("."), call)
                return
            if kind != "alias" and self.changes_state(node, parts, call):
                return
            if self_base:
                self.self_attribute(node, parts, call)
                return
            self.name(base, call=False)
        else:
            self.expr(base)
            if self.changes_state(node, parts, call):
                return
        self.value_attributes(node, parts, call)

    @staticmethod
    def root(node: ast.expr) -> ast.expr:
        """What `a.b[c].d` is taken from: `a`."""
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        return node

    def on_self(self, node: ast.expr) -> bool:
        """Whether `node` is `self.a.b...` (a ModelNew attribute or something inside it)."""
        root = self.root(node)
        return isinstance(root, ast.Name) and self.is_self(root.id)

    def module_level_root(self, node: ast.expr) -> bool:
        """Whether `node` is a module-level name or something inside one."""
        root = self.root(node)
        return isinstance(root, ast.Name) and self.resolve(root.id) not in ("local", "unknown")

    def changes_state(self, node: ast.Attribute, parts: list[str], call: bool) -> bool:
        """Refuse `<module-level or self>...append(...)` (and the other container and
        in-place methods) where it would outlive the call."""
        if not (call and parts[-1] in P.MUTATING_METHODS):
            return False
        holder = node.value
        if self.ctx.kind != "module" and self.module_level_root(holder):
            where = "module-level"
        elif self.on_self(holder) and not self.ctx.init:
            where = "ModelNew's"
        else:
            return False
        self.refuse(
            node,
            f"changing {where} '{ast.unparse(holder)}' from a call is not allowed "
            "(no state across calls)",
        )
        return True

    def is_super_init(self, base: ast.expr, parts: list[str], call: bool) -> bool:
        """`super().__init__(...)` (or `super(ModelNew, self).__init__`) in ModelNew.__init__."""
        if not (isinstance(base, ast.Call) and isinstance(base.func, ast.Name)):
            return False
        if base.func.id != "super" or self.resolve("super") != "builtin":
            return False
        plain = not base.args and not base.keywords
        explicit = (
            len(base.args) == 2
            and not base.keywords
            and isinstance(base.args[0], ast.Name)
            and base.args[0].id == "ModelNew"
            and isinstance(base.args[1], ast.Name)
            and self.is_self(base.args[1].id)
        )
        if self.ctx.init and parts == ["__init__"] and call and (plain or explicit):
            return True
        self.refuse(base, "'super' is only allowed as super().__init__(...) in ModelNew.__init__")
        return True

    def self_attribute(self, node: ast.Attribute, parts: list[str], call: bool) -> None:
        first, info = parts[0], self.info
        if call and len(parts) == 1:
            own_method = first in info.model_methods and self.ctx.kind == "host"
            if not (own_method or (self.ctx.init and first in P.SELF_INIT_CALLS)):
                self.refuse(
                    node,
                    f"calling 'self.{first}' is not allowed {self.where} (a stored module or "
                    "function would compute outside Triton; only ModelNew's own methods)",
                )
            return
        machinery = first in P.NN_MODULE_ATTRIBUTES and first not in info.model_methods
        if machinery and first not in P.SELF_ATTRIBUTES:
            self.refuse(node, f"'self.{first}' reaches nn.Module's own machinery")
            return
        if len(parts) > 1:
            self.value_attributes(node, parts[1:], call)

    def value_attributes(self, node: ast.AST, parts: list[str], call: bool) -> None:
        """Attributes of a value whose type the gate cannot know: checked by name."""
        kind = self.ctx.kind
        for index, attr in enumerate(parts):
            method = call and index == len(parts) - 1
            if kind == "kernel":
                allowed = P.KERNEL_VALUE_ATTRIBUTES
            elif method:
                allowed = P.VALUE_METHODS | (P.INIT_VALUE_METHODS if self.ctx.init else set())
                if kind == "module":
                    allowed = frozenset()
                elif kind == "callback":
                    allowed = {
                        m for m in allowed if m not in P.MUTATING_METHODS and not m.endswith("_")
                    }
            else:
                allowed = P.VALUE_ATTRIBUTES | P.VALUE_METHODS
                allowed |= P.INIT_VALUE_METHODS if self.ctx.init else set()
            if attr not in allowed:
                what = f"method '.{attr}()'" if method else f"attribute '.{attr}'"
                self.refuse(node, f"{what} is not allowed {self.where}")
                return
