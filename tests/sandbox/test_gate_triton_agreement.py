"""Triton reads every kernel the static gate accepts where the gate read it.

The gate judges a candidate's parsed module, but Triton finds a kernel's body by text:
the compiler (`JITCallable.__init__`) cuts the kernel's dedented source lines at the first
line matching `^def\\s+\\w+\\s*\\(`, and the CPU interpreter (`FunctionRewriter._find_def`)
at the last line whose stripped text starts with "def " (its last line when there is
none). If either lands anywhere but the `def` line the gate parsed, Triton runs a body
the gate never checked.

So every candidate the gate accepts is written to a real file and imported under the
CPU interpreter in a fresh process; each JIT function in it (autotuned and heuristic
wrappers followed through `.fn`) is read by Triton's own code, and the test asserts that
the compiler's cut, the interpreter's cut and the interpreter's line numbering
(`get_jit_fn_file_line`, its first "def " line) all start on the gate's `FunctionDef.lineno`, and that both cuts parse to the function the gate
checked. The corpora: the honest files and a sample of the teacher's translations (all
of them with `-m slow`), the cheats the gate lets through to the runtime checks, and
hostile variants of an honest candidate (a `def` line in a docstring, a decorator's
string, a comment, a continued string; tabs, form feeds, `\\r` line ends, Unicode
whitespace): each one is refused by the gate or read where the gate read it, and each
variant written to hide a `def` line is shown to fool Triton when nothing refuses it.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox.gate import kernel_names
from sandbox.problem import detect_format
from sandbox.static_checks import static_verdict
from tests.sandbox.attacks.catalogue import ATTACKS_DIR, load_attacks
from tests.sandbox.cases.manifest import CASES_DIR, load_cases
from tests.sandbox.test_gate_corpora import _honest_files, _teacher_corpus

REPO_ROOT = Path(__file__).resolve().parents[2]
READ_TIMEOUT_S = 600

# Runs in a fresh process: TRITON_INTERPRET must be set before triton is imported. Reads
# the JIT functions of each file named on stdin with Triton's own readers; prints one JSON line.
_READ_KERNELS = r"""
import importlib.util, inspect, json, sys, textwrap, traceback, types
from triton.runtime.interpreter import FunctionRewriter
from triton.runtime.jit import JITCallable, JITFunction, KernelInterface, get_jit_fn_file_line


def python_function(obj):
    for _ in range(8):
        if isinstance(obj, types.FunctionType):
            return obj
        obj = getattr(obj, "fn", None)
    return None


def jit_functions(module):
    spaces = [vars(module)] + [
        vars(value) for value in list(vars(module).values())
        if isinstance(value, type) and value.__module__ == module.__name__
    ]
    found = {}
    for space in spaces:
        for value in list(space.values()):
            if isinstance(value, (KernelInterface, JITCallable)):
                fn = python_function(value)
                if fn is not None:
                    found[id(fn)] = fn
    return list(found.values())


def compiler_cut(fn):
    jit = JITFunction(fn)
    whole = textwrap.dedent("".join(jit.raw_src))
    if not whole.endswith(jit.src):
        raise AssertionError("the compiler's source is not a suffix of the dedented lines")
    line = jit.starting_line_number + whole[: len(whole) - len(jit.src)].count("\n")
    return line, jit.src, get_jit_fn_file_line(jit)[1]


def interpreter_cut(fn):
    lines, start = inspect.getsourcelines(fn)
    rewriter = FunctionRewriter(fn)
    rewriter.def_lineno = rewriter._find_def(lines)
    index = range(len(lines))[rewriter.def_lineno - 1]  # 0 (no 'def ' line): the last line
    return start + index, rewriter._prepare_source(lines)


def attempt(reader, fn):
    try:
        return reader(fn), None
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"


def read(fn):
    compiler, compiler_error = attempt(compiler_cut, fn)
    interpreter, interpreter_error = attempt(interpreter_cut, fn)
    return {
        "name": fn.__name__,
        "first_line": fn.__code__.co_firstlineno,
        "compiler_line": compiler and compiler[0],
        "compiler_source": compiler and compiler[1],
        "numbering_line": compiler and compiler[2],
        "interpreter_line": interpreter and interpreter[0],
        "interpreter_source": interpreter and interpreter[1],
        "errors": [e for e in (compiler_error, interpreter_error) if e],
    }


report = {}
for index, path in enumerate(json.load(sys.stdin)):
    try:
        spec = importlib.util.spec_from_file_location(f"candidate_{index}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        report[path] = {"kernels": [read(fn) for fn in jit_functions(module)]}
    except BaseException as err:
        report[path] = {"error": "".join(traceback.format_exception_only(err))[-600:]}
print(json.dumps(report))
"""


def read_kernels(sources: dict[str, str], folder: Path) -> dict[str, dict[str, Any]]:
    """Triton's readings of each named source's JIT functions, from files in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for index, (label, source) in enumerate(sources.items()):
        path = folder / f"candidate_{index}.py"
        path.write_bytes(source.encode())  # as the sandbox writes it: no newline translation
        paths[label] = str(path)
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, "-c", _READ_KERNELS],
        input=json.dumps(list(paths.values())),
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=READ_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    return {label: report[path] for label, path in paths.items()}


def _shape(node: ast.FunctionDef) -> str:
    """The function as the gate checks it, less its decorators (the cuts start at `def`)
    and the whitespace inside strings (the compiler's dedent rewrites blank lines)."""
    node = copy.deepcopy(node)
    node.decorator_list = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            sub.value = " ".join(sub.value.split())
    return ast.dump(node)


def _cut_shape(source: str | None) -> str:
    if source is None:
        return "no source"
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return f"does not parse: {err.msg}"
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return "not one function"
    return _shape(tree.body[0])


def _gate_def(tree: ast.Module, name: str, first_line: int) -> ast.FunctionDef | None:
    """The FunctionDef whose code object starts at `first_line` (its first decorator's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            starts = [d.lineno for d in node.decorator_list] + [node.lineno]
            if min(starts) == first_line:
                return node
    return None


def disagreements(source: str, reading: dict[str, Any]) -> list[str]:
    """Where Triton's readings of a source's JIT functions leave the gate's parse."""
    if "error" in reading:
        return [f"the candidate does not import: {reading['error']}"]
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as err:
        return [f"the source does not parse: {err}"]
    found = []
    read_names = {kernel["name"] for kernel in reading["kernels"]}
    for missing in sorted(kernel_names(tree) - read_names):
        found.append(f"{missing}: a kernel the gate saw is no JIT function after import")
    for kernel in reading["kernels"]:
        name = kernel["name"]
        node = _gate_def(tree, name, kernel["first_line"])
        if node is None:
            found.append(f"{name}: no def of the gate's starts at line {kernel['first_line']}")
            continue
        lines = {
            reader: kernel[f"{reader}_line"] for reader in ("compiler", "interpreter", "numbering")
        }
        if kernel["errors"] or set(lines.values()) != {node.lineno}:
            found.append(f"{name}: gate def line {node.lineno}, Triton {lines} {kernel['errors']}")
        expected = _shape(node)
        for reader in ("compiler", "interpreter"):
            if _cut_shape(kernel[f"{reader}_source"]) != expected:
                found.append(f"{name}: the {reader}'s cut is not the function the gate checked")
    return found


def assert_agreement(sources: dict[str, str], folder: Path) -> int:
    """Asserts every source reads as the gate read it; the number of JIT functions read."""
    readings = read_kernels(sources, folder)
    report = {
        label: found
        for label, source in sources.items()
        if (found := disagreements(source, readings[label]))
    }
    assert report == {}, json.dumps(report, indent=1)[:6000]
    return sum(len(readings[label]["kernels"]) for label in sources)


# -- corpora the gate accepts -----------------------------------------------------------------


def test_the_honest_files_read_as_the_gate_read_them(tmp_path: Path) -> None:
    sources = {
        str(path.relative_to(REPO_ROOT)): source
        for path, fmt in _honest_files()
        if static_verdict(source := path.read_text(), fmt) is None
    }
    assert len(sources) >= 17
    assert assert_agreement(sources, tmp_path) >= len(sources)


def _teacher_sources(per_operator: int, fused: dict[int, int], seed: int) -> dict[str, str]:
    sources = _teacher_corpus(per_operator, fused, seed)
    return {
        f"teacher_{index}": source
        for index, source in enumerate(sources)
        if static_verdict(source, "functional") is None
    }


def test_a_sample_of_teacher_translations_reads_as_the_gate_read_it(tmp_path: Path) -> None:
    sources = _teacher_sources(2, {2: 10, 3: 5, 5: 5}, seed=7)
    assert len(sources) >= 140
    assert assert_agreement(sources, tmp_path) >= len(sources)


@pytest.mark.slow
def test_many_teacher_translations_read_as_the_gate_read_them(tmp_path: Path) -> None:
    sources = _teacher_sources(20, {level: 60 for level in range(2, 9)}, seed=2026)
    assert assert_agreement(sources, tmp_path) >= len(sources)


def test_the_cheats_the_gate_lets_run_read_as_the_gate_read_them(tmp_path: Path) -> None:
    """Attacks and catalogue cheats the gate accepts are left to the runtime checks: those
    must at least see the kernel bodies the gate checked."""
    cheats = [
        (ATTACKS_DIR / f"{attack.name}.py", attack.source(), attack.problem_source())
        for attack in load_attacks()
    ] + [
        (CASES_DIR / case.candidate, case.candidate_source(), case.problem_source())
        for case in load_cases("adversarial")
    ]
    assert len(cheats) >= 60
    sources = {
        str(path.relative_to(REPO_ROOT)): source
        for path, source, problem in cheats
        if static_verdict(source, detect_format(problem)) is None
    }
    if sources:  # none left to the runtime checks: nothing to read
        assert_agreement(sources, tmp_path)


# -- hostile variants of an honest candidate --------------------------------------------------

BASE_PATH = CASES_DIR / "honest" / "autotuned_row_sum.py"
BASE_FORMAT = "functional"
KERNEL = "_row_sum_kernel"
DEF_LINE = f"def {KERNEL}(x_ptr, out_ptr, N, stride_row, BLOCK: tl.constexpr):"
FIRST_BODY_LINE = "    row = tl.program_id(0)\n"
LAST_BODY_LINE = "    tl.store(out_ptr + row, tl.sum(acc, axis=0))\n"
JIT_LINE = "@triton.jit\n"
FIRST_DECORATOR_LINE = "@triton.autotune(\n"
ONE_LINER = "@triton.jit\ndef _zero(x_ptr): tl.store(x_ptr, 0.0)\n"
HOST_HELPER = "def _host_helper(x):\n    return x\n"
KEY_LINE = '    key=["N"],\n'
# What a hidden line holds: a signature Triton would take for the kernel's start.
FAKE = f"{KERNEL}(x_ptr, out_ptr, N, stride_row, BLOCK: tl.constexpr):"


def _replace(source: str, old: str, new: str) -> str:
    if old not in source:
        raise AssertionError(f"the base candidate has no {old!r}")
    return source.replace(old, new, 1)


def _docstring(text: str) -> Callable[[str], str]:
    """Puts `text` on lines of its own in a docstring that opens the kernel's body."""
    return lambda s: _replace(
        s, FIRST_BODY_LINE, f'    """Row sums.\n{text}\n    """\n' + FIRST_BODY_LINE
    )


def _statement(literal: str) -> Callable[[str], str]:
    """Puts a string statement (`literal`, already indented) first in the kernel's body."""
    return lambda s: _replace(s, FIRST_BODY_LINE, literal + "\n" + FIRST_BODY_LINE)


def _decorator_key(text: str) -> Callable[[str], str]:
    """Adds a triple-quoted autotune key holding `text` on a line of its own."""
    return lambda s: _replace(s, KEY_LINE, f'    key=["N", """\n{text}\n"""],\n')


def _def_line(new: str) -> Callable[[str], str]:
    return lambda s: _replace(s, DEF_LINE, new)


def _after_kernel(text: str) -> Callable[[str], str]:
    return lambda s: _replace(s, LAST_BODY_LINE, LAST_BODY_LINE + text + "\n")


def _before_kernel(text: str) -> Callable[[str], str]:
    return lambda s: _replace(s, FIRST_DECORATOR_LINE, text + "\n\n" + FIRST_DECORATOR_LINE)


def _line_ends(end: str) -> Callable[[str], str]:
    return lambda s: s.replace("\n", end)


def _rename(name: str) -> Callable[[str], str]:
    return lambda s: s.replace(KERNEL, name)


def _then(*steps: Callable[[str], str]) -> Callable[[str], str]:
    def apply(source: str) -> str:
        for step in steps:
            source = step(source)
        return source

    return apply


@dataclass(frozen=True)
class Variant:
    name: str
    make: Callable[[str], str]
    # Written to move a reader off the kernel's def line: Triton misreads it ungated.
    hides_def: bool


VARIANTS = [
    # A `def` line hidden in the kernel's docstring: the interpreter takes the last one.
    Variant("docstring_def", _docstring(f"def {FAKE}"), True),
    Variant("docstring_indented_def", _docstring(f"    def {FAKE}"), True),
    Variant("docstring_tab_indented_def", _docstring(f"\tdef {FAKE}"), True),
    Variant("docstring_two_space_def", _docstring(f"def  {FAKE}"), True),
    Variant("docstring_def_tab_name", _docstring(f"def\t{FAKE}"), False),
    Variant("docstring_def_newline_name", _docstring(f"def\n{FAKE}"), False),
    Variant("docstring_nbsp_def", _docstring(f"\xa0def {FAKE}"), True),
    Variant("docstring_em_space_def", _docstring(f"\u2003def {FAKE}"), True),
    Variant("docstring_ideographic_space_def", _docstring(f"\u3000def {FAKE}"), True),
    Variant("docstring_line_separator_def", _docstring(f"\u2028def {FAKE}"), True),
    Variant("docstring_paragraph_separator_def", _docstring(f"\u2029def {FAKE}"), True),
    Variant("docstring_next_line_def", _docstring(f"\x85def {FAKE}"), True),
    Variant("docstring_file_separator_def", _docstring(f"\x1cdef {FAKE}"), True),
    Variant("docstring_form_feed_def", _docstring(f"\x0cdef {FAKE}"), True),
    Variant("docstring_vertical_tab_def", _docstring(f"\x0bdef {FAKE}"), True),
    Variant("docstring_carriage_return_def", _docstring(f"Row sums.\rdef {FAKE}"), True),
    Variant("docstring_crlf_file_def", _then(_docstring(f"def {FAKE}"), _line_ends("\r\n")), True),
    Variant("docstring_cr_file_def", _then(_docstring(f"def {FAKE}"), _line_ends("\r")), True),
    Variant("bytes_statement_def", _statement(f'    b"""\ndef {FAKE}\n"""'), True),
    Variant("fstring_statement_def", _statement(f'    f"""\ndef {FAKE}\n"""'), True),
    Variant("continued_string_def", _statement(f'    "Row sums.\\\ndef {FAKE}"'), True),
    Variant(
        "signature_default_def", _def_line(DEF_LINE[:-2] + f', DOC="""\ndef {FAKE}\n"""):'), True
    ),
    # In a decorator's argument, before the real `def`: the compiler takes the first one.
    Variant("decorator_string_def", _decorator_key(f"def {FAKE}"), True),
    Variant("decorator_string_def_tab_name", _decorator_key(f"def\t{FAKE}"), True),
    Variant("decorator_string_def_newline_name", _decorator_key(f"def\n{FAKE}"), True),
    Variant(
        "heuristics_string_def",
        lambda s: _replace(
            s,
            JIT_LINE,
            f'@triton.heuristics({{"DOC": lambda args: """\ndef {FAKE}\n"""}})\n' + JIT_LINE,
        ),
        True,
    ),
    # The kernel's own `def` line written so that one reader does not find it.
    Variant("def_tab_name", _def_line(DEF_LINE.replace("def ", "def\t")), True),
    Variant("def_form_feed_indent", _def_line("\x0c" + DEF_LINE), True),
    Variant("def_two_spaces", _def_line(DEF_LINE.replace("def ", "def  ")), False),
    Variant("def_space_before_paren", _def_line(DEF_LINE.replace("(", " (", 1)), False),
    # Comments: never a `def` line to Triton, unless a `\r` ends them.
    Variant("comment_def", _statement(f"    # def {FAKE}"), False),
    Variant("comment_form_feed_def", _statement(f"    #\x0cdef {FAKE}"), False),
    Variant(
        "comment_carriage_return_def",
        _after_kernel("    # note\rdef _helper(x):\r    return x"),
        False,
    ),
    # Where the kernel's block ends (`inspect.getblock`): the interpreter's last `def` line.
    Variant(
        "trailing_comments_then_host_def", _after_kernel(f"    # def {FAKE}\n        # end"), False
    ),
    Variant("one_line_kernel_then_host_def", _before_kernel(ONE_LINER + HOST_HELPER), False),
    Variant(
        "continued_one_line_kernel_then_host_def",
        _before_kernel(ONE_LINER.replace(": tl.", ": \\\n    tl.") + HOST_HELPER),
        False,
    ),
    # Honest text in unusual clothes: must read the same.
    Variant("crlf_line_ends", _line_ends("\r\n"), False),
    Variant("cr_line_ends", _line_ends("\r"), False),
    Variant("cr_crlf_line_ends", _line_ends("\r\r\n"), False),
    Variant("mixed_line_ends", lambda s: s.replace(":\n", ":\r\n").replace(",\n", ",\r"), False),
    Variant("byte_order_mark", lambda s: "\ufeff" + s, False),
    Variant("tab_indented_body", lambda s: s.replace("\n    ", "\n\t"), False),
    Variant("docstring_def_words", _docstring("default blocks; define: rows\ndefs, def:"), False),
    Variant("non_ascii_name", _rename("_row_sum_kernél"), False),
    Variant("nfkc_name", _rename("_row_sum_kerﬁ"), False),
]


@functools.cache
def _variant_sources() -> dict[str, str]:
    base = BASE_PATH.read_text()
    sources = {variant.name: variant.make(base) for variant in VARIANTS}
    assert all(source != base for source in sources.values())
    return sources


@pytest.fixture(scope="module")
def variant_readings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Triton's readings of every variant, refused or not (their hidden text is inert)."""
    return read_kernels(_variant_sources(), tmp_path_factory.mktemp("variants"))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_a_variant_is_refused_or_read_as_the_gate_read_it(
    variant: Variant, variant_readings: dict[str, dict[str, Any]]
) -> None:
    source = _variant_sources()[variant.name]
    if static_verdict(source, BASE_FORMAT) is not None:
        return
    found = disagreements(source, variant_readings[variant.name])
    assert found == [], f"the gate accepts {variant.name!r}, Triton reads elsewhere: {found}"


def test_the_hiding_variants_fool_triton_when_nothing_refuses_them(
    variant_readings: dict[str, dict[str, Any]],
) -> None:
    """Without the gate each hiding variant moves a reader: the test above can fail."""
    sources = _variant_sources()
    unfooled = [
        v.name
        for v in VARIANTS
        if v.hides_def and not disagreements(sources[v.name], variant_readings[v.name])
    ]
    assert unfooled == [], "these variants no longer test anything: Triton reads them right"
    assert sum(v.hides_def for v in VARIANTS) >= 20
