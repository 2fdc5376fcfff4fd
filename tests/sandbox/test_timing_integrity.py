"""Timing integrity on a real GPU: no attack earns a speedup the honest kernel lacks.

Each attack in `gpu_cases/` computes the right answer with the honest twin's fused kernel
(`gpu_cases/honest_fused.py`) and would look faster if nothing stopped it, one class of
the threat model's timing section each: answers reused across timed runs (caches keyed on
the inputs' addresses or objects), timed runs told apart (counting calls, `%globaltimer`),
work outside the timed window (a patched harness, CUDA graphs), the L2 flush buffer
swapped, the baselines slowed by a neighbour's kernel. They run with the static gate off
(it refuses all of them: `test_gate_corpora`), on two problems: `mul_add` (128 MiB of
inputs: 8 input sets in rotation, fewer timed runs) and `mul_add_small` (a fresh set for
every timed run). The honest twin's speedup must hold within 3% from one verification to
the next, and an attack judged correct may not beat it by more. Skipped without CUDA; the
same checks on the CPU, without timing: `test_timed_inputs.py`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.sandbox.test_gpu_cheats import GPU_CASES_DIR, HONEST_TWIN, GpuCase, load_gpu_case

if TYPE_CHECKING:
    from sandbox.api import LocalSandbox
    from sandbox.result import VerifyResult

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

PROBLEMS = {
    "mul_add": GPU_CASES_DIR / "problems" / "mul_add.py",
    "mul_add_small": GPU_CASES_DIR / "problems" / "mul_add_small.py",
}
HONEST_SPREAD = 0.03  # the honest twin's speedup, verification to verification
ATTACKS = [
    "cache_by_address",
    "cache_copy_by_address",
    "cache_last_input",
    "skip_unchecked_runs",
    "globaltimer_gap",
    "patch_harness_fetch",
    "graph_at_import",
    "swap_flush_buffer",
    "rig_clock_object",
    "side_stream",
]


def _sandbox(workers: int) -> LocalSandbox:
    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig

    config = SandboxConfig(
        device="cuda", workers=workers, allow_weak_isolation=True, static_gate=False
    )
    return LocalSandbox(config)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with _sandbox(1) as local:
        yield local


def _fresh(problem: Path) -> str:
    """The problem's source under a key of its own: baselines measured anew for it."""
    return f"# {uuid.uuid4().hex}\n{problem.read_text()}"


@pytest.fixture(scope="module")
def honest(sandbox: LocalSandbox) -> dict[str, list[VerifyResult]]:
    """Three verifications of the honest twin on each problem."""
    twin = (GPU_CASES_DIR / HONEST_TWIN).read_text()
    results: dict[str, list[VerifyResult]] = {}
    for name, path in PROBLEMS.items():
        problem = path.read_text()
        results[name] = [sandbox.verify(problem, twin, timing=True) for _ in range(3)]
        for result in results[name]:
            assert result.verdict == "correct", f"{name}: {result.verdict}: {result.message}"
            assert result.speedup_vs_eager is not None, result.timing_unavailable_reason
    return results


def _speedup(results: list[VerifyResult]) -> float:
    return statistics.median(float(r.speedup_vs_eager or 0.0) for r in results)


def test_the_honest_speedup_holds_from_one_verification_to_the_next(
    honest: dict[str, list[VerifyResult]],
) -> None:
    for name, results in honest.items():
        speedups = [float(r.speedup_vs_eager or 0.0) for r in results]
        assert max(speedups) <= min(speedups) * (1 + HONEST_SPREAD), (name, speedups)


def test_timed_runs_and_what_the_result_says_about_them(
    honest: dict[str, list[VerifyResult]],
) -> None:
    """A fresh set for each run of the small problem; the large one's 8 sets allow 13 runs
    (7 on fresh sets), and its result says so."""
    from sandbox.config import SandboxConfig
    from sandbox.timed_inputs import plan_timing

    config = SandboxConfig()
    small = honest["mul_add_small"][0]
    assert 0 < small.timing_runs <= config.timing_runs and "timed with" not in small.message
    large = honest["mul_add"][0]
    plan = plan_timing(2 * 64 * 2**20, 64 * 2**20, config.timing_runs, config.timing_warmup)
    assert 0 < large.timing_runs <= plan.runs == 13
    assert "timed with 8 input sets for" in large.message, large.message


def _cases() -> Iterator[object]:
    for name in ATTACKS:
        case = load_gpu_case(GPU_CASES_DIR / f"{name}.py")
        problems = {case.problem.stem, "mul_add_small"}
        for problem in sorted(problems):
            yield pytest.param(case, problem, id=f"{name}-{problem}")


@pytest.mark.parametrize(("case", "problem"), list(_cases()))
def test_no_timing_attack_beats_the_honest_kernel(
    case: GpuCase, problem: str, sandbox: LocalSandbox, honest: dict[str, list[VerifyResult]]
) -> None:
    bar = _speedup(honest[problem])
    result = sandbox.verify(PROBLEMS[problem].read_text(), case.candidate.read_text(), timing=True)
    detail = (
        f"{case.name} on {problem}: verdict {result.verdict} ({result.message[:1500]}); "
        f"speedup_vs_eager {result.speedup_vs_eager}, honest {bar:.3f}, "
        f"candidate_ms {result.candidate_ms}, eager_ms {result.eager_ms}, runs {result.timing_runs}"
    )
    assert result.verdict in case.expect, detail
    if result.verdict == "correct":
        assert result.speedup_vs_eager is not None, detail
        assert result.speedup_vs_eager <= bar * (1 + HONEST_SPREAD), detail


def test_a_neighbour_spinning_at_import_does_not_slow_the_baselines() -> None:
    """A job of the same problem launches a kernel that spins for seconds at import while
    the group's first job measures the baselines every job of the group is scored by.
    The baselines come out as on a quiet GPU (or, with the GPU never idle, unmeasured):
    never slowed, which would inflate every speedup of the group."""
    twin = (GPU_CASES_DIR / HONEST_TWIN).read_text()
    spinner = (GPU_CASES_DIR / "spin_at_import.py").read_text()  # about 15 s of spinning
    path = PROBLEMS["mul_add"]
    with _sandbox(2) as local:
        quiet = local.verify(_fresh(path), twin, timing=True)
        assert quiet.verdict == "correct" and quiet.eager_ms, quiet.message
        problem = _fresh(path)
        results: dict[str, VerifyResult] = {}

        def run(name: str, candidate: str) -> None:
            results[name] = local.verify(problem, candidate, timing=True)

        owner = threading.Thread(target=run, args=("honest", twin))
        owner.start()  # first of the group: it measures the baselines
        time.sleep(0.2)
        neighbour = threading.Thread(target=run, args=("spinner", spinner))
        neighbour.start()
        owner.join(300)
        neighbour.join(300)
    honest = results["honest"]
    assert honest.verdict == "correct", honest.message
    for name in ("eager_ms", "compile_ms"):
        value, alone = getattr(honest, name), getattr(quiet, name)
        if value is not None and alone is not None:
            assert value <= alone * (1 + HONEST_SPREAD), (name, value, alone, honest.stage_seconds)


_SPIN = """
import sys, torch
torch.cuda.init()
torch.cuda._sleep(1000)
torch.cuda.synchronize()
print("spinning", flush=True)
for _ in range(6):
    torch.cuda._sleep(int(2e9))
torch.cuda.synchronize()
"""


def test_the_idle_probe_reads_another_process_kernel_as_a_busy_gpu() -> None:
    from sandbox.grading.idle import IdleProbe
    from sandbox.timing import bind_clock

    probe = IdleProbe(bind_clock())
    idle_ms = probe.calibrate()
    assert probe.check().idle, idle_ms
    spinner = subprocess.Popen([sys.executable, "-c", _SPIN], stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout is not None and spinner.stdout.readline().strip() == "spinning"
        busy = probe.check()
    finally:
        spinner.kill()
        spinner.wait(30)
    assert not busy.idle, (busy.ms, idle_ms)
    time.sleep(1.0)  # the spinner's context gone
    assert probe.check().idle
