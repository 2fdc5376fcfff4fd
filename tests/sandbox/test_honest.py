"""Honest kernels must be accepted: a sandbox that rejects good Triton is as broken as one
that accepts cheats.

Each honest case (elementwise, reduction, softmax, matmul with tl.dot, layer norm, conv2d,
several outputs, broadcasting, fused matmul + ReLU, a KernelBench `ModelNew`) is
submitted with `timing=False` to the session's real server and must come back
`correct`. A second test runs the same kernels against their references in a plain
interpreter process, with no sandbox at all, so that a failure says whose fault it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox.client import SandboxClient
from sandbox.result import VerifyResult
from tests.sandbox.cases.manifest import CASES_DIR, Case, load_cases

HONEST = load_cases("honest")
CONCURRENCY = 2
JOB_TIMEOUT_S = 240.0
REPO_ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh process: TRITON_INTERPRET must be set before triton is imported.
_REFERENCE_CHECK = r"""
import importlib.util, json, sys
import torch
from triton.runtime.autotuner import Autotuner
from sandbox.guard import _wrap_autotuner
from sandbox.interpreter_check import interpreter_problem

if interpreter_problem():  # this host cannot interpret kernels (its own test says why)
    print(json.dumps({"interpreter": interpreter_problem()}))
    sys.exit(0)

# The interpreter cannot benchmark: autotuned kernels run their first config.
Autotuner.run = _wrap_autotuner(Autotuner.run, interpreted=True)

def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

report = {}
for index, (problem_path, candidate_path) in enumerate(json.loads(sys.argv[1])):
    try:
        problem = load(problem_path, f"problem_{index}")
        candidate = load(candidate_path, f"candidate_{index}")
        kernelbench = hasattr(problem, "Model")
        tol = 1e-2 if kernelbench else 1e-4
        if kernelbench:
            torch.manual_seed(42)
            reference = problem.Model(*problem.get_init_inputs()).eval()
            torch.manual_seed(42)
            entry = candidate.ModelNew(*problem.get_init_inputs())
        else:
            reference, entry = problem.fused_operator, candidate.triton_fused_operator
        problems = []
        for seed in (11, 12):
            torch.manual_seed(seed)
            inputs = problem.get_inputs()
            with torch.no_grad():
                expected = reference(*inputs)
                got = entry(*[x.clone() for x in inputs])
            expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
            got = [got] if isinstance(got, torch.Tensor) else list(got)
            if len(got) != len(expected):
                problems.append(f"seed {seed}: {len(got)} outputs, expected {len(expected)}")
                continue
            for i, (g, e) in enumerate(zip(got, expected)):
                if g.shape != e.shape or g.dtype != e.dtype:
                    problems.append(f"seed {seed} output {i}: {g.shape} {g.dtype} vs {e.shape} {e.dtype}")
                elif not torch.allclose(g, e, atol=tol, rtol=tol):
                    problems.append(f"seed {seed} output {i}: max error {(g - e).abs().max().item():.3g}")
        report[candidate_path] = problems
    except Exception as error:
        report[candidate_path] = [f"{type(error).__name__}: {str(error)[:500]}"]
print(json.dumps(report))
"""


def explain(case: Case, result: VerifyResult) -> str:
    log = result.candidate_log[-1500:] if result.candidate_log else ""
    return (
        f"{case.candidate} (tries: {case.tries})\n"
        f"  expected correct, got {result.verdict}\n"
        f"  message: {result.message[:2000]}\n"
        f"  kernel launches: {result.kernel_launches}; trials: {result.trials}\n"
        f"  candidate log tail: {log}"
    )


def verify_case(client: SandboxClient, case: Case) -> VerifyResult:
    return client.verify(
        case.problem_source(),
        case.candidate_source(),
        timing=False,
        timeout_s=JOB_TIMEOUT_S,
        **case.options,
    )


@pytest.fixture(scope="module")
def submitted(sandbox_client: SandboxClient) -> Iterator[dict[str, Future[VerifyResult]]]:
    """Every honest case, submitted up front, CONCURRENCY at a time."""
    pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="honest")
    futures = {case.id: pool.submit(verify_case, sandbox_client, case) for case in HONEST}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_honest_suite_covers_the_kinds_of_kernel() -> None:
    names = {case.name for case in HONEST}
    assert len(HONEST) >= 10
    assert all(case.expect == ("correct",) for case in HONEST)
    assert {"matmul_relu", "conv2d", "softmax", "layernorm", "kb_linear_relu"} <= names


@pytest.mark.parametrize("case", HONEST, ids=lambda case: case.name)
def test_honest_kernel_is_accepted(case: Case, submitted: dict[str, Future[VerifyResult]]) -> None:
    """The real sandbox grades a good kernel `correct`."""
    result = submitted[case.id].result(timeout=JOB_TIMEOUT_S * 2)
    assert result.verdict == "correct", explain(case, result)
    assert result.kernel_launches >= 1, explain(case, result)


def test_honest_kernels_match_reference_without_sandbox(tmp_path: Path) -> None:
    """The kernels are right by themselves (Triton's interpreter, no sandbox involved)."""
    pairs = [[str(CASES_DIR / case.problem), str(CASES_DIR / case.candidate)] for case in HONEST]
    script = tmp_path / "reference_check.py"
    script.write_text(_REFERENCE_CHECK)
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(pairs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "interpreter" in report:
        pytest.skip(report["interpreter"])
    failures = {Path(path).name: issues for path, issues in report.items() if issues}
    assert failures == {}, f"honest kernels disagree with their references: {failures}"
