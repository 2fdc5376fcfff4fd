"""Checks on the candidate's text as its readers other than `ast.parse` see it.

The gate judges the parsed module, but two readers take the file as text:

* Python's import decodes the file's bytes by its encoding declaration (PEP 263), while the
  gate parses the text it was given. A declared codec such as UTF-7 turns bytes the gate
  read as a comment into code, so any declaration other than UTF-8 is refused.
* Triton finds a kernel's body by text: the compiler cuts the kernel's source lines at
  the first line that starts with `def`, the CPU interpreter at the last one. A `def`
  line hidden in a string (a docstring, a decorator's argument) would make Triton compile
  or interpret a body the gate never checked, so every line that starts with `def` must
  be the `def` of a function the gate saw.

Lines are split as `linecache` splits them (universal newlines), and `str.strip()` is the
same stripping Triton applies.
"""

from __future__ import annotations

import ast
import io
import re

from sandbox.gate.context import Violation

# PEP 263: a comment on line 1 or 2 matching this declares the file's encoding.
_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
_UTF8 = {"utf-8", "utf8", "utf_8", "utf-8-sig", "utf_8_sig", "u8", "utf"}
# What Triton's readers may take for a definition line: `def` then anything but a name char.
_DEF_LINE = re.compile(r"def(?![\w])")
# How a kernel's own `def` line must read, stripped, so that every reader finds it: the
# interpreter looks for "def " (one space), the compiler for `def\s+name\s*(`.
_PLAIN_DEF = re.compile(r"def [A-Za-z_]\w*\s*\(")
# Characters that some readers take for line breaks or strip as whitespace and others not.
_AMBIGUOUS = re.compile("[\x0b\x0c\x1c-\x1f\x85\u2028\u2029]")


def source_lines(source: str) -> list[str]:
    """The source's lines as `linecache` (so `inspect.getsource`) reads them."""
    return io.StringIO(source, newline=None).readlines()


def text_violations(source: str, tree: ast.Module) -> list[Violation]:
    """Encoding declarations and hidden `def` lines in `source` (parsed as `tree`)."""
    lines = source_lines(source)
    found: list[Violation] = []
    for number, line in enumerate(lines[:2], start=1):
        match = _CODING.match(line)
        if match and match.group(1).lower().replace("_", "-") not in _UTF8:
            found.append(Violation(number, f"encoding declaration '{match.group(1)}': only UTF-8"))
    real = {
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for number, line in enumerate(lines, start=1):
        if _AMBIGUOUS.search(line):
            found.append(
                Violation(number, "a form feed, vertical tab or other line-separator character")
            )
        if number in real and not _PLAIN_DEF.match(line.strip()):
            found.append(Violation(number, "a function's line must read 'def name(' (one space)"))
        elif number not in real and _DEF_LINE.match(line.strip()):
            found.append(
                Violation(
                    number,
                    "a line starting with 'def' inside a string or a continued line "
                    "(Triton finds kernels by their 'def' lines)",
                )
            )
    return found
