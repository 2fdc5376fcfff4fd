"""Prefixing a module's own top-level names, scope by scope, keeping its text."""

from __future__ import annotations

from typing import Any

import pytest

from learner.search.rename import RenameError, prefix_names, top_level_names

MODULE = '''\
import math

BLOCK = 128
SUFFIX = "!"
LABEL = "× " + SUFFIX  # a non-ASCII character before a renamed name on the line


def helper(value):
    return value * 2


def shadow(BLOCK, helper=helper):
    """A parameter named like a global stays the parameter."""
    return BLOCK + helper(1)


def uses_globals(items):
    # A comprehension and a lambda: their own names stay theirs.
    doubled = [helper(v) for v in items]
    pick = lambda helper: helper  # noqa: E731
    return sum(doubled) + pick(BLOCK) + math.floor(1.5)


def rebinds():
    global BLOCK
    BLOCK = BLOCK + 1
    return BLOCK


class Holder:
    SUFFIX = "class-level"

    def method(self):
        return SUFFIX  # the module's SUFFIX: a class body is not a method's scope


def entry(x):
    local = helper(x)
    return [local, shadow(3), uses_globals([1, 2]), Holder().method(), LABEL]
'''


def _run(source: str, entry: str) -> tuple[Any, dict[str, Any]]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<module>", "exec"), namespace)  # noqa: S102 - test source
    return namespace[entry](5), namespace


def test_renamed_module_behaves_the_same_under_its_new_names() -> None:
    renamed = prefix_names(MODULE, "p_")
    expected, _ = _run(MODULE, "entry")
    got, namespace = _run(renamed.source, "p_entry")
    assert got == expected
    assert set(renamed.names) == {
        "BLOCK", "SUFFIX", "LABEL", "helper", "shadow", "uses_globals", "rebinds", "Holder", "entry",
    }  # fmt: skip
    assert "math" not in renamed.names  # imports are shared, never renamed
    assert namespace["p_rebinds"]() == 129 and namespace["p_BLOCK"] == 129
    assert "def shadow(BLOCK, helper=p_helper):" in renamed.source.replace("p_shadow", "shadow")
    assert "pick = lambda helper: helper" in renamed.source
    assert "# A comprehension and a lambda: their own names stay theirs." in renamed.source
    assert 'LABEL = "× " + p_SUFFIX' in renamed.source.replace("p_LABEL", "LABEL")


def test_kernel_parameters_named_like_globals_are_not_renamed() -> None:
    source = (
        "import triton\nimport triton.language as tl\n\nBLOCK = 64\n\n\n@triton.jit\n"
        "def kernel(x_ptr, BLOCK: tl.constexpr):\n    offs = tl.arange(0, BLOCK)\n\n\n"
        "def triton_fused_operator(x):\n    kernel[(1,)](x, BLOCK=BLOCK)\n    return [x]\n"
    )
    renamed = prefix_names(source, "frag0_")
    assert "def frag0_kernel(x_ptr, BLOCK: tl.constexpr):" in renamed.source
    assert "offs = tl.arange(0, BLOCK)" in renamed.source
    assert "frag0_kernel[(1,)](x, BLOCK=frag0_BLOCK)" in renamed.source
    assert renamed.names["triton_fused_operator"] == "frag0_triton_fused_operator"


def test_top_level_names_skip_imports() -> None:
    import ast

    tree = ast.parse("import torch\nfrom math import sqrt as s\nA = 1\ndef f():\n    B = 2\n")
    assert top_level_names(tree) == ["A", "f"]


def test_star_imports_are_refused() -> None:
    with pytest.raises(RenameError, match="import \\*"):
        prefix_names("from math import *\nA = 1\n", "p_")
