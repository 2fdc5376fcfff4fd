"""The candidate module's top level: imports, definitions, constants and ModelNew.

Module-level code runs at import, before any check can watch it, so it may only import
the allowed modules, define functions (Triton kernels or host code) and the one class
`ModelNew(nn.Module)`, and bind constants; the bodies are then checked by the statement
and expression rules (`statements`, `expressions`).
"""

from __future__ import annotations

import ast
from collections import Counter

from sandbox.gate import policy as P
from sandbox.gate.context import MODULE_LEVEL, Context, ModuleInfo, Violation, construct
from sandbox.gate.scopes import function_scope, parameters
from sandbox.gate.statements import Rules

_ANY_PATH = (
    P.HOST_PATHS
    | P.INIT_PATHS
    | P.KERNEL_PATHS
    | P.KERNEL_DECORATORS
    | P.HOST_DECORATORS
    | P.CONTEXT_MANAGERS
)


def _import_bindings(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(local name, canonical path) for each name an import binds."""
    if isinstance(node, ast.Import):
        return [
            (alias.asname, alias.name)
            if alias.asname
            else (alias.name.split(".")[0], alias.name.split(".")[0])
            for alias in node.names
        ]
    if node.module == "__future__":
        return []
    return [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]


def _decorator_path(rules: Rules, decorator: ast.expr) -> str | None:
    return rules.path_of(decorator.func if isinstance(decorator, ast.Call) else decorator)


def _is_kernel(rules: Rules, node: ast.FunctionDef) -> bool:
    return any(_decorator_path(rules, d) in P.KERNEL_DECORATORS for d in node.decorator_list)


def _model_facts(node: ast.ClassDef, info: ModuleInfo) -> dict[str, set[str]]:
    """ModelNew's methods and the attributes they assign on self; returns which methods
    each method calls on self."""
    calls: dict[str, set[str]] = {}
    for method in node.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        info.model_methods.add(method.name)
        params = parameters(method.args)
        if not params:
            continue
        self_name = params[0].arg
        calls[method.name] = set()
        for sub in ast.walk(method):
            on_self = (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == self_name
            )
            if on_self and isinstance(sub.ctx, ast.Store):
                info.model_attributes.add(sub.attr)
            elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
                func = sub.func
                if isinstance(func.value, ast.Name) and func.value.id == self_name:
                    calls[method.name].add(func.attr)
    return calls


def _setup_methods(calls: dict[str, set[str]], info: ModuleInfo) -> None:
    """Methods that run only while ModelNew.__init__ runs (called from it, or from other such
    methods, and from nowhere else): parameter set-up, which may use PyTorch."""
    setup = {m for m in calls if m not in ("__init__", "forward")} - info.method_callbacks
    changed = True
    while changed:
        changed = False
        for method in sorted(setup):
            callers = {caller for caller, callees in calls.items() if method in callees}
            if not callers or not callers <= setup | {"__init__"}:
                setup.discard(method)
                changed = True
    info.setup_methods = setup


def _import_time_code(tree: ast.Module) -> list[ast.AST]:
    """What runs at import: decorators, defaults, module and class-level values."""
    code: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            code += [*node.decorator_list, *node.args.defaults]
        elif isinstance(node, ast.ClassDef):
            code += [s for s in node.body if isinstance(s, ast.Assign | ast.AnnAssign)]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            code.append(node)
    return code


def _called_names(nodes: list[ast.AST], names: set[str]) -> set[str]:
    return {
        call.func.id
        for node in nodes
        for call in ast.walk(node)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in names
    }


def _callbacks(tree: ast.Module, info: ModuleInfo) -> None:
    """Functions and ModelNew methods used as values (not called), called at import, or
    called by such functions or by lambdas: whoever receives them (a launch grid, an
    autotuner hook, `sorted`) may call them where the runtime poisoning does not reach, so
    they are checked as callbacks, which only compute values."""
    defs = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    defs -= info.kernels | info.model_methods
    called: set[int] = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in defs:
            if id(node) not in called:
                info.callbacks.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Load)
            and node.attr in info.model_methods
            and id(node) not in called
        ):
            info.method_callbacks.add(node.attr)
    lambdas: list[ast.AST] = [n.body for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    info.callbacks |= _called_names(_import_time_code(tree) + lambdas, defs)
    bodies = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in defs:
            bodies.setdefault(node.name, []).extend(node.body)
    grown = True
    while grown:  # what a callback calls is a callback too
        reached = _called_names([s for n in info.callbacks for s in bodies.get(n, [])], defs)
        grown = not reached <= info.callbacks
        info.callbacks |= reached


def _mutable_constants(tree: ast.Module, info: ModuleInfo) -> None:
    """Module-level names bound to containers (list, dict, set): functions may read them
    (index, iterate, `in`, pass to a builtin) but not keep state in them."""
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            value = node.value
            builds = (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and (value.func.id in ("list", "dict", "set"))
            )
            if builds or isinstance(
                value, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                info.mutables |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        read: list[ast.AST] = []
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            read = [node.value]
        elif isinstance(node, ast.Attribute):
            read = [node.value]  # methods: the value rules allow only reading ones
        elif isinstance(node, ast.For | ast.comprehension):
            read = [node.iter]
        elif isinstance(node, ast.Compare):
            pairs = zip(node.ops, node.comparators, strict=True)
            read = [c for op, c in pairs if isinstance(op, ast.In | ast.NotIn)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in P.READING_BUILTINS
        ):
            read = list(node.args)
        info.read_only_uses |= {id(n) for n in read if isinstance(n, ast.Name)}


def collect(tree: ast.Module, rules: Rules) -> None:
    """Fill `rules.info` with the module's bindings (before any body is judged)."""
    info = rules.info
    model_calls: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            info.aliases.update(_import_bindings(node))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            (info.kernels if _is_kernel(rules, node) else info.functions).add(node.name)
        elif isinstance(node, ast.ClassDef):
            info.classes.add(node.name)
            if node.name == "ModelNew":
                model_calls = _model_facts(node, info)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                info.constants |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    _callbacks(tree, info)
    _setup_methods(model_calls, info)
    _mutable_constants(tree, info)


def _statement_bindings(node: ast.stmt) -> list[str]:
    """The names a module-level or class-body statement binds."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [name for name, _ in _import_bindings(node)]
    if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
        return [node.name]
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _bound_twice(tree: ast.Module) -> list[Violation]:
    """A module-level name bound twice could be a kernel at one moment and host code at
    another; the gate judges each name by one binding."""
    first_line: dict[str, int] = {}
    counts: Counter[str] = Counter()
    plain_imports: Counter[str] = Counter()  # `import torch` and `import torch.nn` bind torch
    for node in tree.body:
        if isinstance(node, ast.AugAssign):
            continue  # rebinds its own constant
        if isinstance(node, ast.Import):
            plain_imports.update(n for n, path in _import_bindings(node) if n == path)
        for name in _statement_bindings(node):
            counts[name] += 1
            first_line.setdefault(name, node.lineno)
            if counts[name] == 2:
                first_line[name] = node.lineno
    return [
        Violation(first_line[name], f"'{name}' is bound more than once at module level")
        for name, count in counts.items()
        if count > 1 and plain_imports[name] != count
    ]


def _is_literal(node: ast.expr) -> bool:
    """Numbers, strings, booleans, None and tuples/lists of them."""
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return not any(isinstance(n, ast.Dict | ast.Set) for n in ast.walk(node))


def _bare_annotations(tree: ast.Module) -> list[Violation]:
    """`name: type` with no value at module level binds nothing at run time, so the name
    would find whatever else is there (a builtin, or a global Triton's interpreter adds),
    while the gate would judge it the candidate's constant."""
    return [
        Violation(node.lineno, "an annotation without a value is not allowed at module level")
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and node.value is None
    ]


def _shadowed_builtins(tree: ast.Module) -> list[Violation]:
    """Module-level and ModelNew class-body bindings of builtin names.

    There a binding may hold the builtin itself (`exec = exec`), or nothing at all (a bare
    annotation `exec: int` binds no value, so the name still finds the builtin), while the
    gate would judge the name as the candidate's constant. In a function a builtin's name
    is a local, whose value the gate judges where it is assigned.
    """
    statements: list[ast.stmt] = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            statements += node.body
    return [
        Violation(node.lineno, f"'{name}' is a builtin's name: it may not be bound here")
        for node in statements
        for name in _statement_bindings(node)
        if name in P.BUILTIN_NAMES
    ]


class ModuleRules(Rules):
    """Module-level statements, decorators and ModelNew's structure."""

    def module(self, tree: ast.Module) -> None:
        self.violations += _bound_twice(tree)
        for node in tree.body:  # imports first: names a refused import binds stay quiet
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.import_(node)
        for node in tree.body:
            self.top_level(node)

    def top_level(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            pass  # checked first
        elif isinstance(node, ast.FunctionDef):
            self.function(node)
        elif isinstance(node, ast.ClassDef):
            self.model(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            self.stmt(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            pass  # a docstring
        elif isinstance(node, ast.Pass):
            pass
        elif isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            self.refuse(
                node,
                "'if __name__ == \"__main__\"' is not allowed (the candidate is "
                "imported, never run as a script)",
            )
        else:
            what = "expression statement" if isinstance(node, ast.Expr) else f"'{construct(node)}'"
            self.refuse(
                node,
                f"module-level {what} is not allowed (only imports, definitions "
                "and constants at module level: no side effects at import)",
            )
            if isinstance(node, ast.Expr):
                self.expr(node.value)
            else:
                self.inner_statements(node)

    def import_(self, node: ast.Import | ast.ImportFrom) -> None:
        before = len(self.violations)
        self.check_import(node)
        if len(self.violations) > before:
            self.info.refused_aliases |= {name for name, _ in _import_bindings(node)}

    def check_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in P.IMPORTS:
                    self.refuse(node, f"import of '{alias.name}' is not allowed")
            return
        if node.level:
            self.refuse(node, "relative imports are not allowed")
            return
        module = node.module or ""
        for alias in node.names:
            path = f"{module}.{alias.name}"
            if alias.name == "*":
                self.refuse(node, f"'from {module} import *' is not allowed")
            elif module == "__future__":
                if alias.name not in P.FUTURE_NAMES:
                    self.refuse(node, f"'from __future__ import {alias.name}' is not allowed")
            elif path in P.IMPORTS:
                continue
            elif module not in P.IMPORTS or path not in _ANY_PATH:
                self.refuse(node, f"import of '{path}' is not allowed")

    # -- functions ------------------------------------------------------------------------
    def decorators(self, node: ast.FunctionDef, method: bool) -> bool:
        """Check a def's decorators; whether they make it a Triton kernel."""
        paths = []
        for decorator in node.decorator_list:
            path = _decorator_path(self, decorator)
            call = decorator if isinstance(decorator, ast.Call) else None
            if path in P.KERNEL_DECORATORS and not method:
                if path != "triton.jit" and call is None:
                    self.refuse(decorator, f"'@{path}' needs its arguments")
                if path == "triton.jit" and call is not None:
                    unknown = [k.arg for k in call.keywords if k.arg not in P.JIT_KEYWORDS]
                    if call.args or unknown:
                        self.refuse(
                            decorator,
                            f"triton.jit arguments {unknown or 'positional'} are not allowed",
                        )
                if call is not None:
                    with self.entering(MODULE_LEVEL):
                        self.arguments(call)
            elif (
                path in P.HOST_DECORATORS and call is not None and not (call.args or call.keywords)
            ):
                pass
            else:
                self.refuse(decorator, f"decorator '@{ast.unparse(decorator)}' is not allowed")
                continue
            paths.append(path)
        kernel = "triton.jit" in paths
        if any(p in P.KERNEL_DECORATORS for p in paths) and not kernel:
            self.refuse(node, f"'{node.name}' has Triton decorators but no @triton.jit")
        if kernel and any(p in P.HOST_DECORATORS for p in paths):
            self.refuse(node, f"kernel '{node.name}' may only have Triton decorators")
        return kernel

    def function(self, node: ast.FunctionDef) -> None:
        kernel = self.decorators(node, method=False)
        if kernel:
            ctx = Context("kernel")
        elif node.name in self.info.callbacks:
            ctx = Context("callback")
        else:
            ctx = Context("host")
        self.function_body(node, ctx)

    # -- ModelNew ---------------------------------------------------------------------------
    def model(self, node: ast.ClassDef) -> None:
        if node.name != "ModelNew":
            self.refuse(
                node,
                f"class '{node.name}' is not allowed (the one class a candidate "
                "may define is ModelNew(nn.Module))",
            )
            return
        for decorator in node.decorator_list:
            self.refuse(decorator, "decorators on ModelNew are not allowed")
        bases = [self.path_of(base) for base in node.bases]
        if bases != ["torch.nn.Module"] or node.keywords:
            self.refuse(
                node, "ModelNew must derive from nn.Module alone (no other bases, no metaclass)"
            )
        for statement in node.body:
            if isinstance(statement, ast.FunctionDef):
                self.method(statement)
            elif isinstance(statement, ast.Assign | ast.AnnAssign):
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                for target in targets:
                    if not isinstance(target, ast.Name) or target.id.startswith("__"):
                        self.refuse(
                            target, f"class attribute '{ast.unparse(target)}' is not allowed"
                        )
                    elif target.id in P.NN_MODULE_ATTRIBUTES:
                        self.refuse(
                            target,
                            f"class attribute '{target.id}' would replace "
                            "nn.Module's own machinery",
                        )
                if statement.value is None or not _is_literal(statement.value):
                    # Python's class-body scoping (a value sees the class's names, a lambda
                    # or comprehension inside it does not) is not the gate's to model.
                    self.refuse(statement, "ModelNew's class attributes must be literal constants")
            elif not (isinstance(statement, ast.Pass) or self.is_docstring(statement)):
                self.refuse(
                    statement,
                    f"'{construct(statement)}' is not allowed in ModelNew's "
                    "body (methods and constants only)",
                )

    @staticmethod
    def is_docstring(node: ast.stmt) -> bool:
        return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)

    def method(self, node: ast.FunctionDef) -> None:
        name = node.name
        ordinary = not name.startswith("__") and name not in P.NN_MODULE_ATTRIBUTES
        if name not in ("__init__", "forward") and not (
            ordinary and name not in P.TENSOR_ATTRIBUTES
        ):
            self.refuse(
                node,
                f"method name '{name}' is not allowed in ModelNew (only __init__, "
                "forward and helpers named unlike nn.Module's and Tensor's attributes)",
            )
            return
        self.decorators(node, method=True)
        params = parameters(node.args)
        if not node.args.posonlyargs + node.args.args:
            self.refuse(node, f"method '{name}' must take self")
            return
        scope = function_scope(node)
        kind = "callback" if name in self.info.method_callbacks else "host"
        init = name == "__init__" or name in self.info.setup_methods
        ctx = Context(kind, self_scope=scope, self_name=params[0].arg, init=init)
        self.function_body(node, ctx, scope)


def check_module(tree: ast.Module) -> list[Violation]:
    """Every violation of the gate's policy in a parsed candidate, by line."""
    rules = ModuleRules(ModuleInfo())
    collect(tree, rules)
    rules.module(tree)
    found = set(rules.violations) | set(_shadowed_builtins(tree)) | set(_bare_annotations(tree))
    return sorted(found)


def kernel_names(tree: ast.Module) -> set[str]:
    """Module-level functions with a Triton decorator, however triton was imported."""
    rules = ModuleRules(ModuleInfo())
    collect(tree, rules)
    return set(rules.info.kernels)
