"""The sandbox's case catalogue: problems, candidates, and the verdict each must get.

Every candidate file starts with a header line

    # expect: VERDICT[|VERDICT...]  problem: problems/NAME.py  options: {"time_budget_s": 10}

(`options` is optional JSON, passed to `verify` as keywords) and a second comment line
saying what it tries. `manifest.json` lists the same facts for tools that do not read
Python; `check_manifest()` says where the two disagree. Several verdicts are allowed
only where several are right (an escape attempt that a stricter sandbox may also
reject); everywhere else the verdict is exact. A candidate the static gate refuses
(`sandbox.gate`) expects `disallowed_code`: nothing of it runs.

Escape candidates (`escape/`) are templates: the test fills `@@PORT@@`, `@@PATH@@`
or `@@MARKER@@` with values of its own before submitting them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CASES_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = CASES_DIR / "manifest.json"
KINDS = ("honest", "adversarial", "escape")
VERDICT_NAMES = frozenset(
    {
        "correct",
        "syntax_error",
        "no_entry_point",
        "no_triton_kernel",
        "compile_error",
        "runtime_error",
        "timeout",
        "resource_limit",
        "wrong_output",
        "torch_fallback",
        "input_mutation",
        "tampering",
        "disallowed_code",
    }
)
_HEADER = re.compile(
    r"^#\s*expect:\s*(?P<expect>[a-z_|]+)\s+problem:\s*(?P<problem>\S+)"
    r"(?:\s+options:\s*(?P<options>\{.*\}))?\s*$"
)


@dataclass(frozen=True)
class Case:
    """One (problem, candidate) pair and the verdicts it may get."""

    kind: str
    candidate: str  # relative to CASES_DIR
    problem: str  # relative to CASES_DIR
    expect: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    tries: str = ""

    @property
    def name(self) -> str:
        return Path(self.candidate).stem

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"

    def problem_source(self) -> str:
        return (CASES_DIR / self.problem).read_text()

    def candidate_source(self, **fill: str) -> str:
        """The candidate's source, with `@@KEY@@` placeholders replaced by `fill`."""
        source = (CASES_DIR / self.candidate).read_text()
        for key, value in fill.items():
            placeholder = f"@@{key.upper()}@@"
            if placeholder not in source:
                raise KeyError(f"{self.candidate} has no {placeholder}")
            source = source.replace(placeholder, value)
        return source


def parse_header(path: Path) -> Case:
    """The case a candidate file describes in its first two lines."""
    lines = path.read_text().splitlines()
    match = _HEADER.match(lines[0]) if lines else None
    if match is None:
        raise ValueError(f"{path}: first line must be '# expect: VERDICT  problem: FILE'")
    expect = tuple(match["expect"].split("|"))
    unknown = set(expect) - VERDICT_NAMES
    if unknown:
        raise ValueError(f"{path}: unknown verdicts {sorted(unknown)}")
    options = json.loads(match["options"]) if match["options"] else {}
    tries = lines[1].lstrip("#").strip() if len(lines) > 1 and lines[1].startswith("#") else ""
    kind = path.parent.name
    return Case(
        kind=kind,
        candidate=f"{kind}/{path.name}",
        problem=match["problem"],
        expect=expect,
        options=options,
        tries=tries,
    )


def scan_headers() -> list[Case]:
    """Every candidate file under the kind directories, read from its header."""
    cases = []
    for kind in KINDS:
        for path in sorted((CASES_DIR / kind).glob("*.py")):
            cases.append(parse_header(path))
    return cases


def load_cases(kind: str | None = None) -> list[Case]:
    """The cases listed in manifest.json, optionally of one kind."""
    entries = json.loads(MANIFEST_PATH.read_text())["cases"]
    cases = [
        Case(
            kind=entry["kind"],
            candidate=entry["candidate"],
            problem=entry["problem"],
            expect=tuple(entry["expect"]),
            options=dict(entry.get("options", {})),
            tries=entry.get("tries", ""),
        )
        for entry in entries
    ]
    return [case for case in cases if kind is None or case.kind == kind]


def manifest_entries(cases: list[Case]) -> dict[str, Any]:
    """The manifest.json document for these cases."""
    return {
        "cases": [
            {
                "kind": case.kind,
                "candidate": case.candidate,
                "problem": case.problem,
                "expect": list(case.expect),
                "options": case.options,
                "tries": case.tries,
            }
            for case in cases
        ]
    }


def check_manifest() -> list[str]:
    """Disagreements between manifest.json, the headers and the files on disk."""
    problems: list[str] = []
    listed = {case.candidate: case for case in load_cases()}
    scanned = {case.candidate: case for case in scan_headers()}
    for missing in sorted(scanned.keys() - listed.keys()):
        problems.append(f"{missing} is not in manifest.json")
    for extra in sorted(listed.keys() - scanned.keys()):
        problems.append(f"manifest.json lists {extra}, which does not exist")
    for key in sorted(listed.keys() & scanned.keys()):
        a, b = listed[key], scanned[key]
        for attr in ("kind", "problem", "expect", "options", "tries"):
            if getattr(a, attr) != getattr(b, attr):
                problems.append(
                    f"{key}: {attr} is {getattr(a, attr)!r} in manifest.json "
                    f"but {getattr(b, attr)!r} in the header"
                )
        if not (CASES_DIR / a.problem).is_file():
            problems.append(f"{key}: problem {a.problem} does not exist")
    return problems


if __name__ == "__main__":
    # Regenerate manifest.json from the headers: python -m tests.sandbox.cases.manifest
    MANIFEST_PATH.write_text(json.dumps(manifest_entries(scan_headers()), indent=2) + "\n")
    print(f"wrote {MANIFEST_PATH} ({len(scan_headers())} cases)")
