"""The teacher's kernels judged by the real sandbox: every operator, and fused programs.

Generated `tiny`-profile programs are translated and verified by a `LocalSandbox`
(jailed candidate processes, 5 trials, the PyTorch-fallback and no-launch checks):
on a machine without a GPU under Triton's interpreter, with a GPU on it. The slow
variant (`pytest -m slow`) takes twenty programs per operator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pytest

from synth.teacher import translate
from synth.teacher.parse import OPERATORS

from .conftest import DEVICE

if TYPE_CHECKING:
    from sandbox.api import LocalSandbox

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

OPERATOR_NAMES = sorted(set(OPERATORS) - {"copy"})
MAX_FLOPS = 2**15  # cheap under the interpreter
# The interpreter runs a deep convolution's taps one Python step at a time: a few of
# these take minutes on a CPU, milliseconds on a GPU.
JOB_BUDGET_S = 900.0 if DEVICE == "cpu" else 120.0


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    api = pytest.importorskip("sandbox.api")
    from sandbox.config import SandboxConfig

    config = SandboxConfig(
        device=DEVICE,
        workers=2,
        allow_weak_isolation=os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1",
    )
    with api.LocalSandbox(config) as local:
        yield local


def _programs(level: int, count: int, seed: int, ops: list[str] | None = None) -> list[str]:
    generate = pytest.importorskip("synth.generate")
    drawn = generate.generate_programs(level, 3 * count, seed, "tiny", ops)
    return [record.source for record in drawn if record.flops <= MAX_FLOPS][:count]


def _failures(sandbox: LocalSandbox, labelled: list[tuple[str, str]]) -> list[str]:
    """Verify every (label, problem) pair; describe each one that is not correct."""

    def judge(item: tuple[str, str]) -> str | None:
        label, problem = item
        result = sandbox.verify(
            problem, translate(problem).code, timing=False, time_budget_s=JOB_BUDGET_S
        )
        if result.verdict == "correct":
            return None
        return f"{label}: {result.verdict}: {result.message[:300]}\n{problem}"

    with ThreadPoolExecutor(max_workers=4) as pool:  # two graders, two queued
        return [failure for failure in pool.map(judge, labelled) if failure]


def _every_operator(per_operator: int, seed: int) -> list[tuple[str, str]]:
    labelled = []
    for name in OPERATOR_NAMES:
        programs = _programs(1, per_operator, seed, [name])
        assert len(programs) == per_operator, f"only {len(programs)} cheap {name} programs"
        labelled += [(name, source) for source in programs]
    return labelled


def test_every_operator_is_verified_by_the_sandbox(sandbox: LocalSandbox) -> None:
    assert len(OPERATOR_NAMES) == 61
    failures = _failures(sandbox, _every_operator(3, seed=7))
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize(("level", "count"), [(2, 8), (5, 4)])
def test_fused_programs_are_verified_by_the_sandbox(
    sandbox: LocalSandbox, level: int, count: int
) -> None:
    programs = _programs(level, count, seed=31)
    assert len(programs) == count
    failures = _failures(sandbox, [(f"level {level}", p) for p in programs])
    assert not failures, "\n\n".join(failures)


@pytest.mark.slow
def test_twenty_programs_per_operator_are_verified_by_the_sandbox(sandbox: LocalSandbox) -> None:
    failures = _failures(sandbox, _every_operator(20, seed=2026))
    assert not failures, f"{len(failures)} failed:\n\n" + "\n\n".join(failures)
