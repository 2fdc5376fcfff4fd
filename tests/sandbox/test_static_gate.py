"""The static gate: one attack per refused construct class, and the honest idioms it accepts.

Every attack below would hand back the right answer (a ReLU) if it ran: the work is done
by PyTorch, NumPy or the host, or the instruments are switched off, rather than by the
Triton kernel. So a refusal here proves the gate, not a broken attack. Each refusal must
name the construct and its line.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from sandbox.gate import violations
from sandbox.static_checks import static_verdict

KERNEL = """\
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
"""
LAUNCH = """\
out = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
"""


def functional(body: str, prelude: str = "", epilogue: str = "") -> str:
    """The ReLU kernel, `prelude` at module level, `body` as triton_fused_operator(x)."""
    source = KERNEL + textwrap.dedent(prelude)
    source += "\n\ndef triton_fused_operator(x):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    return source + textwrap.dedent(epilogue)


def model(init: str, forward: str, prelude: str = "", methods: str = "") -> str:
    """The ReLU kernel and a ModelNew with these __init__ and forward bodies."""
    source = KERNEL + "import torch.nn as nn\n" + textwrap.dedent(prelude)
    source += "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
    source += "        super().__init__()\n" + textwrap.indent(textwrap.dedent(init), " " * 8)
    source += "\n    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(forward), " " * 8)
    return source + textwrap.indent(textwrap.dedent(methods), "    ")


def kernel_body(statements: str, prelude: str = "") -> str:
    """A kernel whose body does `statements` before storing x (no host tricks at all)."""
    body = textwrap.indent(textwrap.dedent(statements), "    ")
    return (
        "import torch\nimport triton\nimport triton.language as tl\n"
        + textwrap.dedent(prelude)
        + "\n\n@triton.jit\ndef k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        + "    offs = tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs, mask=offs < n)\n"
        + body
        + "    tl.store(out_ptr + offs, x, mask=offs < n)\n\n\n"
        + "def triton_fused_operator(x):\n    out = torch.empty_like(x)\n"
        + "    k[(1,)](x, out, x.numel(), BLOCK=1024)\n    return [out]\n"
    )


# (id, source, fragment the reason must contain)
ATTACKS = [
    # -- modules that reach the process, memory or other threads
    ("import_numpy", functional(
        "return [torch.from_numpy(np.maximum(x.numpy(), 0))]", prelude="import numpy as np\n"),
     "import of 'numpy' is not allowed"),
    ("import_in_function", functional("import os\nos.system('true')\n" + LAUNCH + "return [out]"),
     "'import' is not allowed in host code"),
    ("from_import_star", functional(LAUNCH + "return [out]", prelude="from torch import *\n"),
     "'from torch import *' is not allowed"),
    ("private_torch_module", functional(
        "torch._C._set_dispatch_mode(None)\nreturn [x.clamp(min=0)]"),
     "attribute access '_C' is not allowed"),
    ("torch_sys_modules", functional(
        "guard = torch.sys.modules['sandbox.guard']\n" + LAUNCH + "return [out]"),
     "'torch.sys.modules' is not allowed"),
    ("torch_ops_aten", functional("return [torch.ops.aten.relu(x)]"),
     "'torch.ops.aten.relu' is not allowed"),
    ("relative_import", functional(LAUNCH + "return [out]", prelude="from . import helper\n"),
     "relative imports are not allowed"),
    ("typing_eval", functional(LAUNCH + "return [out]",
                               prelude="from typing import get_type_hints\n"),
     "import of 'typing.get_type_hints' is not allowed"),
    # -- strings turned into names, dynamic attribute access, dunders
    ("getattr", functional("relu = getattr(torch, 're' + 'lu')\nreturn [relu(x)]"),
     "name 'getattr' is not allowed"),
    ("module_dict", functional("return [torch.__dict__['relu'](x)]"),
     "attribute access '__dict__' is not allowed (dunder names)"),
    ("dunder_import", functional("os = __import__('os')\n" + LAUNCH + "return [out]"),
     "name '__import__' is not allowed (dunder names)"),
    ("type_mro", functional("base = type(x).__mro__[1]\nreturn [base.relu(x)]"),
     "name 'type' is not allowed"),
    ("eval", functional("return [eval('torch.relu')(x)]"), "name 'eval' is not allowed"),
    ("vars", functional("return [vars(torch)['relu'](x)]"), "name 'vars' is not allowed"),
    ("format_attribute", functional("name = '{0.__class__}'.format(x)\n" + LAUNCH + "return [out]"),
     "method '.format()' is not allowed"),
    ("fstring_dunder", functional("name = f'{x.__class__.__name__}'\n" + LAUNCH + "return [out]"),
     "attribute access '__class__' is not allowed (dunder names)"),
    ("shadowed_builtin", functional(
        "found = [sorted(['/etc/hostname'], key=open) for open in [open]]\n" + LAUNCH
        + "return [out]"),
     "name 'open' is not allowed"),
    ("module_as_value", functional("m = torch\nreturn [m.relu(x)]"),
     "module 'torch' cannot be used as a value"),
    # -- PyTorch compute in host code
    ("torch_function", functional("return [torch.relu(x)]"), "'torch.relu' is not allowed"),
    ("functional_api", functional("return [F.relu(x)]", prelude="import torch.nn.functional as F\n"),
     "'torch.nn.functional.relu' is not allowed"),
    ("tensor_method", functional("return [x.clamp(min=0)]"), "method '.clamp()' is not allowed"),
    ("tolist", functional("return [torch.tensor([max(v, 0.0) for v in x.flatten().tolist()])]"),
     "method '.tolist()' is not allowed"),
    ("item", functional("return [x.new_full(x.shape, max(x.max().item(), 0.0))]"),
     "method '.max()' is not allowed"),
    ("data_ptr", functional("key = x.data_ptr()\n" + LAUNCH + "return [out]"),
     "method '.data_ptr()' is not allowed"),
    ("clone_copy", functional("out = x.clone()\nout.copy_(x)\nreturn [out]"),
     "method '.clone()' is not allowed"),
    ("stored_module_call", model("self.act = nn.ReLU()", "return self.act(x)"),
     "calling 'self.act' is not allowed"),
    ("init_only_outside_init", model(
        "self.w = nn.Parameter(torch.ones(1))",
        "self.reset()\n" + LAUNCH + "return out",
        methods="\ndef reset(self):\n    nn.init.ones_(self.w)\n"),
     "'torch.nn.init.ones_' is not allowed"),
    # -- monkey patching and the instruments
    ("patch_tensor_method", functional(
        LAUNCH + "return [out]", prelude="torch.Tensor.copy_ = lambda self, other: self\n"),
     "assigning to attribute 'torch.Tensor.copy_' is not allowed"),
    ("patch_in_function", functional("torch.allclose = lambda *a, **k: True\nreturn [x]"),
     "assigning to attribute 'torch.allclose' is not allowed"),
    ("nn_module_machinery", model("self.register_forward_hook(lambda m, i, o: o)",
                                  LAUNCH + "return out"),
     "calling 'self.register_forward_hook' is not allowed"),
    ("override_call", model("", LAUNCH + "return out",
                            methods="\ndef __call__(self, x):\n    return x\n"),
     "method name '__call__' is not allowed"),
    ("override_module_method", model("", LAUNCH + "return out",
                                     methods="\ndef to(self, *args):\n    return self\n"),
     "method name 'to' is not allowed"),
    ("tensor_named_method", model("", LAUNCH + "return out",
                                  methods="\ndef data_ptr(self):\n    return 0\n"),
     "method name 'data_ptr' is not allowed"),
    ("module_internals", model("self._forward_hooks.clear()", LAUNCH + "return out"),
     "attribute access '_forward_hooks' is not allowed"),
    ("super_outside_init", model("", "super().forward(x)\n" + LAUNCH + "return out"),
     "'super' is only allowed as super().__init__(...)"),
    ("other_class", functional(LAUNCH + "return [out]",
                               prelude="class Agreeable(torch.Tensor):\n    pass\n"),
     "class 'Agreeable' is not allowed"),
    ("rebind_alias", functional(LAUNCH + "return [out]", prelude="tl = torch\n"),
     "'tl' is bound more than once at module level"),
    # -- state across calls (a cached answer, or a counter telling calls apart)
    ("global", functional("global CALLS\nCALLS = CALLS + 1\n" + LAUNCH + "return [out]",
                          prelude="CALLS = 0\n"), "'global' is not allowed"),
    ("module_cache_write", functional(
        "key = tuple(x.shape)\nif key not in CACHE:\n" + textwrap.indent(LAUNCH, "    ")
        + "    CACHE[key] = out\nreturn [CACHE[key]]", prelude="CACHE = {}\n"),
     "writing into module-level 'CACHE' from a function is not allowed"),
    ("module_cache_alias", functional(
        "cache = CACHE\ncache.append(x)\n" + LAUNCH + "return [out]", prelude="CACHE = []\n"),
     "module-level container 'CACHE' may only be read"),
    ("module_cache_nested", functional(
        "SLOTS[0].append(x)\n" + LAUNCH + "return [out]", prelude="SLOTS = [[]]\n"),
     "changing module-level 'SLOTS[0]' from a call is not allowed"),
    ("module_cache_nested_item", functional(
        "SLOTS[0][0] = x\n" + LAUNCH + "return [out]", prelude="SLOTS = [[None]]\n"),
     "writing into module-level 'SLOTS[0]' from a function is not allowed"),
    ("self_cache_nested", model("self.slots = ([],)",
                                "self.slots[0].append(x)\n" + LAUNCH + "return out"),
     "changing ModelNew's 'self.slots[0]' from a call is not allowed"),
    ("mutable_default", functional(LAUNCH + "return [helper(out)]",
                                   epilogue="\n\ndef helper(t, seen=[]):\n    seen.append(t)\n"
                                   "    return seen[0]\n"),
     "a mutable default argument is not allowed"),
    ("self_state_in_forward", model(
        "self.last = None",
        "if self.last is not None:\n    return self.last\n" + LAUNCH + "self.last = out\nreturn out"),
     "assigning 'self.last' outside ModelNew.__init__ is not allowed"),
    # -- code run where the runtime poisoning does not reach
    ("grid_callback_stores", functional(
        "out = torch.empty_like(x)\n"
        "relu_kernel[lambda meta: fill(out, x)](x, out, x.numel(), BLOCK=256)\nreturn [out]",
        epilogue="\n\ndef fill(out, x):\n    out[:] = x * (x > 0)\n    return (1,)\n"),
     "assigning to an item is not allowed in a callback"),
    ("hook_in_config", functional(
        LAUNCH + "return [out]",
        prelude="CONFIG = triton.Config({}, pre_hook=lambda args: args['out'].zero_())\n"),
     "method '.zero_()' is not allowed in a callback"),
    ("jit_hook", functional(LAUNCH + "return [out]").replace(
        "@triton.jit", "@triton.jit(launch_metadata=print)"),
     "triton.jit arguments ['launch_metadata'] are not allowed"),
    ("kernel_calls_host", kernel_body("helper()\n", prelude="def helper():\n    return 0\n"),
     "host code 'helper' cannot be used in a @triton.jit kernel"),
    ("kernel_imports_torch", kernel_body("import torch\n"),
     "'import' is not allowed in a @triton.jit kernel"),
    ("kernel_torch_call", kernel_body("x = torch.relu(x)\n"),
     "'torch.relu' is not allowed in a @triton.jit kernel"),
    ("kernel_numpy_handle", kernel_body("x = x + x.handle.data\n"),
     "attribute '.handle' is not allowed in a @triton.jit kernel"),
    ("kernel_getattr", kernel_body("load = getattr(tl, 'load')\n"),
     "name 'getattr' is not allowed in a @triton.jit kernel"),
    ("kernel_calls_parameter", kernel_body("x = n(x)\n"),
     "calling 'n' is not allowed in a @triton.jit kernel"),
    ("kernel_matmul_on_smuggled_objects", kernel_body("x = n[0] @ n[1]\n"),
     "'@' is not allowed in a @triton.jit kernel"),
    ("kernel_loop_over_object", kernel_body("for v in n:\n    x = x + v\n"),
     "a kernel's for loop must run over range"),
    ("kernel_private_language", kernel_body("x = tl.core.maximum(x, 0.0)\n"),
     "'triton.language.core.maximum' is not allowed in a @triton.jit kernel"),
    # -- import-time side effects and statements outside the subset
    ("module_allocation", functional(LAUNCH + "return [out]", prelude="BUFFER = torch.empty(8)\n"),
     "calling 'torch.empty' is not allowed at module level"),
    ("module_launch", functional(LAUNCH + "return [out]",
                                 epilogue="\n\nrelu_kernel[(1,)](None, None, 0, BLOCK=16)\n"),
     "module-level expression statement is not allowed"),
    ("module_loop", functional(LAUNCH + "return [out]",
                               prelude="for name in ('eq', 'ne'):\n    pass\n"),
     "module-level 'for' is not allowed"),
    ("main_block", functional(LAUNCH + "return [out]",
                              epilogue="\n\nif __name__ == '__main__':\n    pass\n"),
     "'if __name__ == \"__main__\"' is not allowed"),
    ("module_walrus", functional(LAUNCH + "return [out]", prelude="A = (B := 3)\n"),
     "a walrus (:=) is not allowed at module level"),
    ("decorator", functional(LAUNCH + "return [helper(out)]",
                             epilogue="\n\n@torch.compile\ndef helper(t):\n    return t\n"),
     "decorator '@torch.compile' is not allowed"),
    ("try_except", functional("try:\n    return [torch.relu(x)]\nexcept Exception:\n    pass"),
     "'try/except' is not allowed in host code"),
    ("stream_context", functional("with torch.cuda.stream(torch.cuda.Stream()):\n"
                                  + textwrap.indent(LAUNCH, "    ") + "return [out]"),
     "context manager 'torch.cuda.stream(torch.cuda.Stream())' is not allowed"),
    ("generator", functional("yield out"), "'yield' is not allowed in host code"),
    ("async", functional(LAUNCH + "return [out]",
                         epilogue="\n\nasync def helper():\n    return 0\n"),
     "module-level 'async def' is not allowed"),
    ("match", functional("match x.dim():\n    case 2:\n        return [torch.relu(x)]"),
     "'match' is not allowed in host code"),
    ("nonlocal", functional("def inner():\n    nonlocal x\n    x = torch.relu(x)\n"
                            "inner()\nreturn [x]"), "'nonlocal' is not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "fragment"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS]
)
def test_the_gate_refuses(source: str, fragment: str) -> None:
    verdict = static_verdict(source, "kernelbench" if "class ModelNew" in source else "functional")
    assert verdict is not None and verdict[0] == "disallowed_code", verdict
    assert fragment in verdict[1], verdict[1]
    found = [str(v) for v in violations(source) if fragment in v.message]
    assert found and all(re.match(r"line [1-9]\d*: ", v) for v in found), found


def test_every_violation_names_its_own_line() -> None:
    source = functional("a = 1\nb = torch.relu(x)\nc = x.numpy()\n" + LAUNCH + "return [out]")
    lines = source.splitlines()
    for violation in violations(source):
        construct = re.search(r"'([^']+)'", violation.message)
        assert construct is not None, violation
        word = construct.group(1).split(".")[-1].strip("()")
        assert word in lines[violation.line - 1], (violation, lines[violation.line - 1])


def test_a_refusal_quotes_the_first_violations_and_counts_the_rest() -> None:
    body = "".join(f"v{i} = torch.relu(x)\n" for i in range(12)) + LAUNCH + "return [out]"
    verdict, message = static_verdict(functional(body), "functional") or ("", "")
    assert verdict == "disallowed_code"
    assert message.count("'torch.relu' is not allowed") == 5 and "(and 7 more)" in message


def test_the_cheaper_checks_come_first() -> None:
    """No kernel, no entry point and syntax errors keep their own verdicts."""
    assert static_verdict("import os\ndef triton_fused_operator(x):\n    return [x]\n",
                          "functional")[0] == "no_triton_kernel"  # fmt: skip
    assert static_verdict(KERNEL + "import os\n", "functional")[0] == "no_entry_point"
    assert static_verdict("def f(:\n", "functional")[0] == "syntax_error"


def test_a_kernel_is_found_however_triton_is_imported() -> None:
    source = functional(LAUNCH + "return [out]").replace("import triton\n", "import triton as tr\n")
    source = source.replace("@triton.jit", "@tr.jit").replace("triton.cdiv", "tr.cdiv")
    assert static_verdict(source, "functional") is None


def test_the_gate_can_be_set_aside_for_tests_of_what_stands_behind_it() -> None:
    source = functional("return [torch.relu(x)]")
    assert static_verdict(source, "functional")[0] == "disallowed_code"
    assert static_verdict(source, "functional", gate=False) is None
    assert static_verdict("def f(:\n", "functional", gate=False)[0] == "syntax_error"


def test_absurd_sources_are_refused_not_raised() -> None:
    deep = functional("y = " + "-" * 5000 + "x\n" + LAUNCH + "return [out]")
    verdict = static_verdict(deep, "functional")
    assert verdict is not None and verdict[0] in ("disallowed_code", "syntax_error")
    assert static_verdict("x = 1\x00\n", "functional")[0] == "syntax_error"


# -- what honest code does ------------------------------------------------------------------

HONEST = {
    "grid_lambda_autotune": """\
        import torch
        import triton
        import triton.language as tl

        CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 4), (256, 8))]


        @triton.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"])
        @triton.jit
        def k(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.atomic_add(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


        def triton_fused_operator(x):
            n = x.numel()
            out = torch.zeros_like(x)
            grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
            k[grid](x, out, n)
            return [out]
        """,
    "tutorial_style": """\
        from __future__ import annotations

        import math
        from typing import Optional

        import torch
        import triton
        import triton.language as tl
        from triton.language.extra import libdevice

        DEVICE = triton.runtime.driver.active.get_active_torch_device()
        ACTIVATIONS = {"tanh": 0, "none": 1}
        SCALE: tl.constexpr = tl.constexpr(2)


        def get_cuda_autotune_config():
            return [triton.Config({"BLOCK": 64}, num_stages=3), triton.Config({"BLOCK": 128})]


        def get_autotune_config():
            return get_cuda_autotune_config()


        @triton.jit
        def _act(x, KIND: tl.constexpr):
            if KIND == 0:
                x = libdevice.tanh(x)
            return x


        @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
        @triton.autotune(configs=get_autotune_config(), key=["n"])
        @triton.jit(do_not_specialize=["n"])
        def k(x_ptr, out_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr):
            pid = tl.program_id(0)
            for i in tl.static_range(2):
                offs = (pid * 2 + i) * BLOCK + tl.arange(0, BLOCK)
                x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
                y = _act(x * SCALE, KIND) / math_pi()
                tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=offs < n)


        @triton.jit
        def math_pi():
            return 3.141592653589793


        def triton_fused_operator(x: torch.Tensor, kind: Optional[str] = None) -> list[torch.Tensor]:
            if x.numel() == 0:
                raise ValueError(f"empty input of shape {tuple(x.shape)}")
            assert x.is_contiguous(), "expected a contiguous input"
            x2 = x.reshape(-1)
            out = torch.empty_like(x2)
            n = x2.numel()
            def grid(meta):
                return (triton.cdiv(n, 2 * meta["BLOCK"]),)
            code = ACTIVATIONS[kind or "tanh"]
            k[grid](x2, out, n, KIND=code)
            del x2
            if (rows := x.shape[0]) > 1 and math.prod(x.shape) > rows:
                pass
            return [out.view(x.shape)]
        """,
    "model_new": """\
        import math

        import torch
        import torch.nn as nn
        from torch.nn import init
        import triton
        import triton.language as tl


        @triton.jit
        def k(x_ptr, w_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * tl.load(w_ptr + offs, mask=m), mask=m)


        class ModelNew(nn.Module):
            BLOCK = 256

            def __init__(self, features, input=None):
                super(ModelNew, self).__init__()
                self.weight = nn.Parameter(torch.empty(features))
                self._scratch_shape = (features,)
                self.register_buffer("scale", torch.ones(features))
                self._reset()

            def _reset(self):
                init.uniform_(self.weight, -1 / math.sqrt(self.weight.numel()), 1.0)
                with torch.no_grad():
                    self.weight.mul_(2.0)
                fan_in, _ = nn.init._calculate_fan_in_and_fan_out(torch.empty(2, 3))

            @torch.no_grad()
            def forward(self, input):
                x = input.contiguous()
                out = torch.empty(self._scratch_shape, device=x.device, dtype=x.dtype)
                n = out.numel()
                if x.is_cuda:
                    with torch.cuda.device(x.device):
                        self._launch(x, out, n)
                else:
                    self._launch(x, out, n)
                return out.view_as(x)

            def _launch(self, x, out, n):
                props_sm = torch.cuda.get_device_properties(0).multi_processor_count if x.is_cuda else 1
                k[(triton.cdiv(n, self.BLOCK), max(props_sm, 1) // props_sm)](
                    x, self.weight, out, n, BLOCK=self.BLOCK
                )
        """,
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_idioms_pass(name: str) -> None:
    source = textwrap.dedent(HONEST[name])
    fmt = "kernelbench" if "class ModelNew" in source else "functional"
    assert violations(source) == []
    assert static_verdict(source, fmt) is None


def test_the_relu_template_itself_passes() -> None:
    assert violations(functional(LAUNCH + "return [out]")) == []
    assert violations(model("", LAUNCH + "return out")) == []


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        # a parameter named like a builtin is the candidate's own value
        ("def pick(input, open):\n    return input\nreturn [pick(out, 0)]", False),
        # a comprehension's first iterable is the enclosing scope's (the builtin here)
        ("found = [sorted([0], key=f) for f in [open]]\nreturn [out]", True),
        # a comprehension variable does not leak into the function
        ("found = [open for open in range(2)]\nkeys = sorted([1], key=open)\nreturn [out]", True),
        # a walrus in a comprehension binds in the function
        ("found = [(y := v) for v in range(2)]\nreturn [out] if y else [out]", False),
        # a lambda's own parameter shadows nothing outside it
        ("f = lambda open: open\nkeys = sorted([1], key=open)\nreturn [out]", True),
    ],
)
def test_names_follow_pythons_scopes(body: str, refused: bool) -> None:
    source = functional(LAUNCH + body)
    assert bool(violations(source)) == refused, violations(source)


# -- what the text hides from the parser ------------------------------------------------------

HIDDEN_DEF_BODY = (
    "def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
    "    np.copyto(np.asarray(out_ptr), np.maximum(np.asarray(x_ptr), 0))\n"
)


@pytest.mark.parametrize(
    "where",
    ["docstring", "string constant", "decorator argument", "tab after def", "carriage returns"],
)
def test_a_def_line_hidden_in_a_string_is_refused(where: str) -> None:
    """Triton finds a kernel by its `def` lines as text (the compiler the first, the CPU
    interpreter the last), so a `def` hidden in a string would run unchecked code."""
    hidden = HIDDEN_DEF_BODY
    if where == "tab after def":
        hidden = hidden.replace("def ", "def\t", 1)
    kernel = KERNEL
    if where == "docstring":
        kernel = kernel.replace(
            "BLOCK: tl.constexpr):\n", f'BLOCK: tl.constexpr):\n    """\n{hidden}    """\n', 1
        )
    elif where == "decorator argument":
        kernel = kernel.replace(
            "@triton.jit\n", f'@triton.jit(do_not_specialize=["""\n{hidden}"""])\n', 1
        )
    else:
        kernel = kernel.replace(
            "BLOCK: tl.constexpr):\n", f'BLOCK: tl.constexpr):\n    note = """\n{hidden}"""\n', 1
        )
    source = (
        kernel
        + "\n\ndef triton_fused_operator(x):\n"
        + textwrap.indent(LAUNCH + "return [out]", "    ")
    )
    if where == "carriage returns":
        source = source.replace("\n", "\r")
    verdict = static_verdict(source, "functional")
    assert verdict is not None and verdict[0] == "disallowed_code", verdict
    assert "a line starting with 'def'" in verdict[1], verdict


@pytest.mark.parametrize(
    "line", ["    default = 1", "    define = 2", "    deferred = 3", "    # def not code"]
)
def test_lines_that_only_look_like_def_pass(line: str) -> None:
    source = functional(line.strip() + "\n" + LAUNCH + "return [out]")
    assert violations(source) == []


@pytest.mark.parametrize("codec", ["utf-7", "latin-1", "cp1252"])
def test_an_encoding_declaration_other_than_utf8_is_refused(codec: str) -> None:
    """Import decodes the file by its declaration; the gate read other text."""
    source = f"# -*- coding: {codec} -*-\n" + functional(LAUNCH + "return [out]")
    verdict = static_verdict(source, "functional")
    assert verdict is not None and "encoding declaration" in verdict[1], verdict
    assert violations("# coding: utf-8\n" + functional(LAUNCH + "return [out]")) == []


def test_a_name_bound_nowhere_is_refused() -> None:
    """Names the interpreter adds to the module's globals (np, inspect) are not the
    candidate's to use."""
    found = violations(functional("y = np\n" + LAUNCH + "return [out]"))
    assert any("name 'np' is not defined" in v.message for v in found), found


@pytest.mark.parametrize("spacing", ["def\t", "def  ", "def\x0c"])
def test_a_kernel_def_line_every_reader_finds(spacing: str) -> None:
    """The interpreter finds a kernel by a "def " line: with a tab (or a form feed) it
    finds none and runs the source's last line instead."""
    source = functional(LAUNCH + "return [out]").replace("def relu_kernel", spacing + "relu_kernel")
    verdict = static_verdict(source, "functional")
    assert verdict is not None and verdict[0] == "disallowed_code", verdict


@pytest.mark.parametrize(
    "prelude",
    [
        "exec = exec\n",
        "exec: int\n",
        "from math import floor as exec\n",
        "def exec(x):\n    return x\n",
    ],
)
def test_a_builtins_name_is_not_bound_at_module_level(prelude: str) -> None:
    """`exec = exec` (or a bare annotation, which binds nothing) would look like the
    candidate's constant to the gate and be the builtin at run time."""
    source = functional("sorted(['0'], key=exec)\n" + LAUNCH + "return [out]", prelude=prelude)
    found = violations(source)
    assert any("'exec' is a builtin's name" in v.message for v in found), found


def test_a_builtins_name_is_not_a_class_attribute() -> None:
    source = model("", "sorted(['0'], key=self.exec)\n" + LAUNCH + "return out")
    source = source.replace(
        "class ModelNew(nn.Module):\n", "class ModelNew(nn.Module):\n    exec = exec\n"
    )
    found = violations(source)
    assert any("'exec' is a builtin's name" in v.message for v in found), found


def test_methods_are_not_reached_through_the_class() -> None:
    """A set-up method (PyTorch allowed, called from __init__) called from forward as
    `ModelNew.m(self, x)` would slip past the gate's call graph."""
    methods = "\ndef setup_weights(self, x):\n    return x @ x\n"
    source = model(
        "self.w = self.setup_weights(torch.ones(2, 2))",
        "y = ModelNew.setup_weights(self, x)\n" + LAUNCH + "return out",
        methods=methods,
    )
    found = violations(source)
    assert any("attributes of the class 'ModelNew'" in v.message for v in found), found


def test_a_bare_annotation_at_module_level_is_refused() -> None:
    """`np: int` binds nothing: the name would find a global Triton's interpreter adds."""
    found = violations(functional(LAUNCH + "return [out]", prelude="np: int\n"))
    assert any("annotation without a value" in v.message for v in found), found


@pytest.mark.parametrize(
    ("attribute", "refused"),
    [
        ("BLOCK = 1024", False),
        ("SIZES = (128, 256)", False),
        ("NAME: str = 'relu'", False),
        ("torch = torch", True),  # a module as a value
        ("keys = forward", True),  # a method under another name, past the call graph
        ("pick = lambda self, x: x", True),
        ("BLOCK: int", True),
    ],
)
def test_modelnew_class_attributes_are_literal_constants(attribute: str, refused: bool) -> None:
    source = model("", LAUNCH + "return out")
    source = source.replace(
        "class ModelNew(nn.Module):\n", f"class ModelNew(nn.Module):\n    {attribute}\n"
    )
    found = [v for v in violations(source) if "literal constants" in v.message]
    assert bool(found) == refused, violations(source)
