"""The static gate against every corpus: zero refusals of honest code, every cheat refused.

(a) the teacher's translations of generated programs (every operator at level 1, fused
programs at levels 2, 3 and 5; many more with `-m slow`); (b) the honest candidates of
the case catalogue, the GPU cases' honest twin and the KernelBench-style ModelNew files
of `cases/kernelbench_honest/` (which are also run against their problems, so the corpus
is honest code, not merely code the gate likes); (c) the catalogue's cheats: the gate's
verdict is the one each case's header expects, and a refusal names its line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.gate import violations
from sandbox.problem import detect_format
from sandbox.static_checks import static_verdict
from tests.sandbox.cases.manifest import CASES_DIR, Case, load_cases

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_CASES_DIR = REPO_ROOT / "tests" / "sandbox" / "gpu_cases"
KERNELBENCH_DIR = CASES_DIR / "kernelbench_honest"


def _translations(level: int, count: int, seed: int, ops: list[str] | None = None) -> list[str]:
    generate = pytest.importorskip("synth.generate")
    from synth.teacher import translate

    drawn = generate.generate_programs(level, count, seed, "tiny", ops)
    return [translate(record.source).code for record in drawn]


def _refusals(sources: list[str]) -> list[str]:
    """Each refused source's first violations (an empty list: all accepted)."""
    refused = []
    for source in sources:
        found = violations(source)
        if found:
            refused.append("; ".join(str(v) for v in found[:3]) + "\n" + source)
    return refused


def _teacher_corpus(per_operator: int, fused: dict[int, int], seed: int) -> list[str]:
    from synth.teacher.parse import OPERATORS

    sources = []
    for name in sorted(set(OPERATORS) - {"copy"}):
        sources += _translations(1, per_operator, seed, [name])
    for level, count in fused.items():
        sources += _translations(level, count, seed)
    return sources


def test_the_teachers_translations_pass() -> None:
    sources = _teacher_corpus(2, {2: 10, 3: 5, 5: 5}, seed=7)
    assert len(sources) >= 140
    refused = _refusals(sources)
    assert not refused, f"{len(refused)} of {len(sources)} refused:\n\n" + "\n\n".join(refused[:3])


@pytest.mark.slow
def test_many_teacher_translations_pass() -> None:
    fused = {level: 60 for level in range(2, 9)}
    sources = _teacher_corpus(20, fused, seed=2026)
    refused = _refusals(sources)
    assert not refused, f"{len(refused)} of {len(sources)} refused:\n\n" + "\n\n".join(refused[:3])


@pytest.mark.slow
def test_the_teacher_tables_programs_pass() -> None:
    """The programs behind bench/teacher_table (the `paper` profile, regenerated from the
    table's own settings), translated: what the GPU sandbox judged, judged by the gate."""
    bench = pytest.importorskip("bench.teacher_bench")
    from synth.teacher import translate

    table = REPO_ROOT / "bench" / "teacher_table" / "results.jsonl"
    meta = json.loads(table.read_text().splitlines()[0])
    records, _ = bench.generate(
        meta["ops"], meta["per_op"], meta["level2"], meta["seed"], meta["profile"]
    )
    assert bench.programs_digest(records) == meta["programs_digest"]
    refused = _refusals([translate(record["source"]).code for record in records])
    assert not refused, f"{len(refused)} of {len(records)} refused:\n\n" + "\n\n".join(refused[:3])


# -- (b) honest files -------------------------------------------------------------------------


def _honest_files() -> list[tuple[Path, str]]:
    """(candidate, format) of every honest file: the catalogue's, the GPU cases' and the
    KernelBench-style ones."""
    files = [(CASES_DIR / c.candidate, CASES_DIR / c.problem) for c in load_cases("honest")]
    for path in sorted(GPU_CASES_DIR.glob("*.py")):
        expect, problem = gpu_case_header(path)
        if expect == ("correct",):
            files.append((path, problem))
    for path in sorted(KERNELBENCH_DIR.glob("*.py")):
        files.append((path, KERNELBENCH_DIR / "problems" / path.name))
    return [(candidate, detect_format(problem.read_text())) for candidate, problem in files]


def test_every_honest_file_passes() -> None:
    files = _honest_files()
    assert len(files) >= 11 + 1 + 5
    assert sum(1 for path, _ in files if path.parent == KERNELBENCH_DIR) >= 5
    refused = {
        str(path.relative_to(REPO_ROOT)): verdict
        for path, fmt in files
        if (verdict := static_verdict(path.read_text(), fmt)) is not None
    }
    assert refused == {}


# Runs in a fresh process: TRITON_INTERPRET must be set before triton is imported.
_RUN_MODELS = r"""
import importlib.util, json, sys
import torch
from triton.runtime.autotuner import Autotuner
from sandbox.guard import _wrap_autotuner

Autotuner.run = _wrap_autotuner(Autotuner.run, interpreted=True)  # no benchmarking here

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

report = {}
for index, (problem_path, candidate_path) in enumerate(json.loads(sys.argv[1])):
    problem = load(problem_path, f"problem_{index}")
    candidate = load(candidate_path, f"candidate_{index}")
    torch.manual_seed(42)
    reference = problem.Model(*problem.get_init_inputs()).eval()
    torch.manual_seed(42)
    ours = candidate.ModelNew(*problem.get_init_inputs())
    errors = []
    for seed in (11, 12):
        torch.manual_seed(seed)
        inputs = problem.get_inputs()
        with torch.no_grad():
            expected = reference(*inputs)
            got = ours(*[x.clone() for x in inputs])
        same = got.shape == expected.shape and got.dtype == expected.dtype
        errors.append((got - expected).abs().max().item() if same else float("inf"))
    report[candidate_path] = max(errors)
print(json.dumps(report))
"""


def test_the_kernelbench_files_are_right() -> None:
    """Each ModelNew matches its Model (same seeded parameters) under Triton's interpreter."""
    pairs = [
        (str(KERNELBENCH_DIR / "problems" / path.name), str(path))
        for path in sorted(KERNELBENCH_DIR.glob("*.py"))
    ]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-c", _RUN_MODELS, json.dumps(pairs)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(errors) == len(pairs)
    assert {Path(p).name: e for p, e in errors.items() if not e <= 1e-4} == {}


# -- (c) cheats -------------------------------------------------------------------------------


def _gate_verdict(case: Case) -> tuple[str, str] | None:
    source = case.candidate_source()
    return static_verdict(source, detect_format(case.problem_source()))


@pytest.mark.parametrize("case", load_cases(), ids=lambda case: case.id)
def test_the_gate_gives_each_case_its_expected_verdict(case: Case) -> None:
    """Refused exactly where the header expects `disallowed_code` alone; where it expects
    other verdicts too (escapes: a stricter sandbox may refuse them) a refusal is allowed;
    everywhere else the candidate reaches the checks behind the gate."""
    verdict = _gate_verdict(case)
    if case.expect == ("disallowed_code",):
        assert verdict is not None and verdict[0] == "disallowed_code", verdict
        assert verdict[1].startswith("the static gate refuses: line "), verdict[1]
    elif verdict is not None:
        assert verdict[0] in case.expect, verdict
    if "disallowed_code" not in case.expect:
        assert verdict is None or verdict[0] != "disallowed_code", verdict


def test_most_cheats_are_stopped_before_they_run() -> None:
    refused = [c.id for c in load_cases("adversarial") if c.expect == ("disallowed_code",)]
    assert len(refused) >= 30, refused


def gpu_case_header(path: Path) -> tuple[tuple[str, ...], Path]:
    """(expected verdicts, problem) from a GPU case's header (its own format: speed bounds)."""
    header = path.read_text().splitlines()[0]
    expect = header.split("expect:")[1].split()[0]
    return tuple(expect.split("|")), GPU_CASES_DIR / header.split("problem:")[1].split()[0]


def test_the_gpu_cheats_are_refused() -> None:
    """Every timing cheat is refused before it runs (its header names the verdicts of the
    checks behind the gate, which `test_gpu_cheats` runs with the gate off); the honest
    twin passes."""
    for path in sorted(GPU_CASES_DIR.glob("*.py")):
        expect, problem = gpu_case_header(path)
        verdict = static_verdict(path.read_text(), detect_format(problem.read_text()))
        if expect == ("correct",):
            assert verdict is None, (path.name, verdict)
        else:
            assert verdict is not None and verdict[0] == "disallowed_code", (path.name, verdict)
