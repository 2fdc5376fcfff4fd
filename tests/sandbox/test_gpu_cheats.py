"""Timing cheats on a real GPU: none of them may buy a speedup the honest kernel lacks.

Every cheat in `gpu_cases/` computes the right answer with the same fused kernel as
`gpu_cases/honest_fused.py`, and then tries to look faster: work on a private stream
left unsynchronised, patched CUDA events / synchronize / host clocks, a rigged clock
object in the timing harness, a forged timing reply on the grader's pipe. Each must
either be rejected with one of the verdicts its header allows, or be judged `correct`
with `speedup_vs_eager` no better than the honest twin's times its `speedup_within`
factor. One more, `torch_compile_laundered`, lets Inductor write the Triton and must be
caught as a PyTorch fallback. Skipped without CUDA.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sandbox.api import LocalSandbox

torch = pytest.importorskip("torch")

needs_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

GPU_CASES_DIR = Path(__file__).resolve().parent / "gpu_cases"
HONEST_TWIN = "honest_fused.py"
_HEADER = re.compile(
    r"^#\s*expect:\s*(?P<expect>[a-z_|]+)\s+problem:\s*(?P<problem>\S+)"
    r"(?:\s+speedup_within:\s*(?P<within>[0-9.]+))?\s*$"
)


@dataclass(frozen=True)
class GpuCase:
    """A GPU timing case: candidate, problem, allowed verdicts, allowed speedup factor."""

    candidate: Path
    problem: Path
    expect: tuple[str, ...]
    speedup_within: float | None

    @property
    def name(self) -> str:
        return self.candidate.stem

    def sources(self) -> tuple[str, str]:
        return self.problem.read_text(), self.candidate.read_text()


def load_gpu_case(path: Path) -> GpuCase:
    match = _HEADER.match(path.read_text().splitlines()[0])
    if match is None:
        raise ValueError(f"{path}: bad header line")
    within = float(match["within"]) if match["within"] else None
    return GpuCase(
        path, GPU_CASES_DIR / match["problem"], tuple(match["expect"].split("|")), within
    )


CHEATS = [
    load_gpu_case(path) for path in sorted(GPU_CASES_DIR.glob("*.py")) if path.name != HONEST_TWIN
]


@pytest.fixture(scope="module")
def gpu_sandbox() -> Iterator[LocalSandbox]:
    """A local CUDA sandbox (same isolated pipeline as the server), one worker, without the
    static gate: it refuses every cheat here (`test_gate_corpora`), and these tests are of
    the timing checks behind it."""
    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig

    config = SandboxConfig(device="cuda", workers=1, allow_weak_isolation=True, static_gate=False)
    sandbox = LocalSandbox(config)
    try:
        yield sandbox
    finally:
        sandbox.close()


@pytest.fixture(scope="module")
def honest_speedup(gpu_sandbox: LocalSandbox) -> float:
    """speedup_vs_eager of the honest fused kernel: the bar no cheat may clear."""
    twin = load_gpu_case(GPU_CASES_DIR / HONEST_TWIN)
    result = gpu_sandbox.verify(*twin.sources(), timing=True)
    assert result.verdict == "correct", f"honest twin: {result.verdict}: {result.message}"
    assert result.speedup_vs_eager is not None, result.timing_unavailable_reason
    return float(result.speedup_vs_eager)


def test_gpu_case_headers() -> None:
    """Every GPU case parses; a case that may pass says how much speedup it may keep."""
    names = {case.name for case in CHEATS}
    assert {"side_stream", "patch_event_timer"} <= names
    assert load_gpu_case(GPU_CASES_DIR / HONEST_TWIN).expect == ("correct",)
    for case in CHEATS:
        assert case.problem.is_file(), case.name
        assert ("correct" in case.expect) == (case.speedup_within is not None), case.name


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=needs_gpu, id=case.name) for case in CHEATS]
)
def test_timing_cheat_gains_nothing(
    case: GpuCase, gpu_sandbox: LocalSandbox, honest_speedup: float
) -> None:
    """Rejected, or correct without a speedup beyond the honest twin's (times a margin)."""
    result = gpu_sandbox.verify(*case.sources(), timing=True)
    detail = (
        f"{case.candidate.name}: verdict {result.verdict} ({result.message[:1500]}); "
        f"speedup_vs_eager {result.speedup_vs_eager}, honest twin {honest_speedup:.3f}, "
        f"candidate_ms {result.candidate_ms}, eager_ms {result.eager_ms}, "
        f"retimed {result.retimed}"
    )
    assert result.verdict in case.expect, detail
    if result.verdict == "correct":
        assert result.speedup_vs_eager is not None, detail
        assert case.speedup_within is not None
        assert result.speedup_vs_eager <= honest_speedup * case.speedup_within, detail
