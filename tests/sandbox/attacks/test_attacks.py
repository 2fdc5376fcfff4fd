"""Attacks on the sandbox's trust boundary (`catalogue.py`): each one is rejected, and
each layer is shown doing its share.

Three runs of every attack:
- undetected, in a plain process: it returns the right answer (so a rejection below is
  the defence's doing, not a broken attack);
- through an in-process `Grader` (real jailed candidate processes), static gate on: any
  rejection;
- the same with the static gate switched off (the grader's static checks without
  `sandbox.gate`): the runtime layer alone (`sandbox.guard` in the candidate process, the
  grader's no-launch call) must give the verdict the attack's header names. Attacks only
  the gate stops are strict xfails there: they must start failing when the runtime layer
  learns to stop them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.config import SandboxConfig
from sandbox.grader import Grader, Job
from sandbox.result import VerifyResult
from tests.sandbox.attacks.catalogue import ATTACKS_DIR, CLASSES, Attack, load_attacks
from tests.sandbox.cases.manifest import CASES_DIR
from tests.sandbox.conftest import cpu_interpreter_problem

ATTACKS = load_attacks()
REPO_ROOT = Path(__file__).resolve().parents[3]
# Two trials (and the no-launch call among them) keep each job near a second on the CPU.
TRIALS = 2
NOT_REJECTIONS = frozenset({"correct", "sandbox_error"})


def explain(attack: Attack, result: VerifyResult) -> str:
    log = result.candidate_log[-1200:] if result.candidate_log else ""
    return (
        f"{attack.name} (class {attack.cls}; tries: {attack.tries})\n"
        f"  expected {' or '.join(attack.expect)}, got {result.verdict}\n"
        f"  message: {result.message[:1500]}\n"
        f"  candidate log tail: {log}"
    )


def _grader(root: Path, gate: bool) -> Grader:
    """A CPU grader in this process (the GPU suites run the cases through a server)."""
    if os.environ.get("DRTRITON_TEST_DEVICE", "cpu") != "cpu":
        pytest.skip("these run through an in-process CPU grader")
    if cpu_interpreter_problem():
        pytest.skip(cpu_interpreter_problem())
    return Grader(SandboxConfig(device="cpu", job_root=str(root), static_gate=gate), "cpu")


@pytest.fixture(scope="module")
def grader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    grader = _grader(tmp_path_factory.mktemp("attacks"), gate=True)
    yield grader
    grader.close()


@pytest.fixture(scope="module")
def ungated_grader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    """The grader's static checks without the static gate (`SandboxConfig.static_gate`)."""
    grader = _grader(tmp_path_factory.mktemp("attacks-ungated"), gate=False)
    yield grader
    grader.close()


def _grade(grader: Grader, attack: Attack) -> VerifyResult:
    job = Job(
        problem=attack.problem_source(),
        candidate=attack.source(),
        timing=False,
        trials=TRIALS,
        budget_s=60.0,
    )
    return grader.grade(job)


def test_catalogue_covers_every_class() -> None:
    by_class = {cls: [a.name for a in ATTACKS if a.cls == cls] for cls in CLASSES}
    assert all(len(names) >= 4 for names in by_class.values()), by_class


def test_each_attack_is_right_when_undetected(cpu_candidates: None) -> None:
    """Nothing stopping it (a plain process, a naive copy out), every attack answers right."""
    pairs = [[str(CASES_DIR / a.problem), str(ATTACKS_DIR / f"{a.name}.py")] for a in ATTACKS]
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "tests.sandbox.attacks.undetected", json.dumps(pairs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if "interpreter" in report:
        pytest.skip(report["interpreter"])
    wrong = {Path(path).stem: found for path, found in report.items() if found}
    assert wrong == {}, f"attacks that are wrong even undetected: {wrong}"


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
def test_attack_is_rejected(grader: Grader, attack: Attack) -> None:
    """With every layer on, the attack is rejected (by the gate or at run time)."""
    result = _grade(grader, attack)
    assert result.verdict not in NOT_REJECTIONS, explain(attack, result)


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(
            attack,
            marks=pytest.mark.xfail(
                strict=True, reason="only the static gate stops it: the runtime layer cannot"
            ),
        )
        if attack.layer == "gate"
        else attack
        for attack in ATTACKS
    ],
    ids=lambda a: a.name,
)
def test_runtime_layer_alone_rejects(ungated_grader: Grader, attack: Attack) -> None:
    """With the static gate off, the runtime layer gives the verdict the attack names."""
    result = _grade(ungated_grader, attack)
    assert result.verdict in attack.expect, explain(attack, result)
