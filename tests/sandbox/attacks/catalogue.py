"""The attack catalogue: candidates written to beat the sandbox's trust boundary.

Each attack file starts with three comment lines:

    # expect: VERDICT[|VERDICT...]  problem: problems/NAME.py
    # Tries: what it does
    # Class: N  caught-without-gate: runtime|gate

`expect` is what the sandbox's runtime layer answers with the static gate switched off
(any rejection is accepted with the gate on); the class is the issue's numbering (1:
switching instruments off, 2: telling checked calls from scored ones, 3: computing where
no check looks, 4: acting after return); `caught-without-gate: gate` marks the attacks
that only the static gate stops. Every attack returns the right answer when nothing
stops it (`test_attacks.test_each_attack_is_right_when_undetected`), so a rejection
proves the defence, not a bug in the attack. Problems live in `tests/sandbox/cases/`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.sandbox.cases.manifest import _HEADER, CASES_DIR, VERDICT_NAMES

ATTACKS_DIR = Path(__file__).resolve().parent
CLASSES = (1, 2, 3, 4)
LAYERS = ("runtime", "gate")
_CLASS_LINE = re.compile(
    r"^#\s*Class:\s*(?P<cls>[1-4])\s+caught-without-gate:\s*(?P<layer>\w+)\s*$"
)


@dataclass(frozen=True)
class Attack:
    name: str
    problem: str  # relative to CASES_DIR
    expect: tuple[str, ...]
    tries: str
    cls: int
    layer: str  # which layer stops it when the static gate is off: "runtime" or "gate"

    def source(self) -> str:
        return (ATTACKS_DIR / f"{self.name}.py").read_text()

    def problem_source(self) -> str:
        return (CASES_DIR / self.problem).read_text()


def parse(path: Path) -> Attack:
    """The attack a file describes in its first three lines."""
    lines = path.read_text().splitlines()
    header = _HEADER.match(lines[0]) if lines else None
    classed = _CLASS_LINE.match(lines[2]) if len(lines) > 2 else None
    if header is None or classed is None or not lines[1].startswith("# Tries: "):
        raise ValueError(f"{path}: needs the expect, Tries and Class header lines")
    expect = tuple(header["expect"].split("|"))
    if set(expect) - VERDICT_NAMES or "correct" in expect:
        raise ValueError(f"{path}: expects {expect}, which is not a list of rejections")
    if classed["layer"] not in LAYERS:
        raise ValueError(f"{path}: caught-without-gate must be one of {LAYERS}")
    if not (CASES_DIR / header["problem"]).is_file():
        raise ValueError(f"{path}: problem {header['problem']} does not exist")
    return Attack(
        name=path.stem,
        problem=header["problem"],
        expect=expect,
        tries=lines[1].removeprefix("# Tries: "),
        cls=int(classed["cls"]),
        layer=classed["layer"],
    )


def load_attacks() -> list[Attack]:
    return [parse(path) for path in sorted(ATTACKS_DIR.glob("*.py")) if _is_attack(path)]


_HELPERS = frozenset({"catalogue.py", "undetected.py"})


def _is_attack(path: Path) -> bool:
    return not path.name.startswith(("test_", "_")) and path.name not in _HELPERS
