"""`build_pairs`: verified pairs only, rejects on the side, resumable and atomic output."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from synth.teacher.build import SandboxDown, build_pairs, read_programs
from synth.teacher.check import check_candidate
from synth.teacher.prompt import extract_code

from .programs import render

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@dataclass
class Verdict:
    verdict: str
    message: str = ""
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None


class LocalVerifier:
    """Stands in for the sandbox: the in-process checker, with a call log."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, problem: str, candidate: str) -> Verdict:
        self.calls += 1
        result = check_candidate(problem, candidate, seeds=(0,))
        return Verdict("correct" if result.correct else "wrong_output", result.message, 1.5)


def _records(tmp_path: Path) -> Path:
    sources = [
        ("a", render([[4, 8]], ["torch.relu({0})"])),
        ("b", render([[3, 5], [5, 2]], ["torch.matmul({0}, {1})", "torch.sigmoid({2})"])),
        ("c", render([[4, 8]], ["torch.exp({0})"])),  # outside the operator set
    ]
    path = tmp_path / "programs.jsonl"
    with open(path, "w") as handle:
        for pid, source in sources:
            handle.write(json.dumps({"id": pid, "level": 1, "source": source}) + "\n")
    return path


def test_build_writes_verified_pairs_and_rejects(tmp_path: Path) -> None:
    out = tmp_path / "pairs.jsonl"
    verifier = LocalVerifier()
    summary = build_pairs(read_programs(_records(tmp_path)), out, verifier, progress=False)
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [p["program_id"] for p in pairs] == ["a", "b"]
    for pair in pairs:
        assert pair["verdict"] == "correct" and pair["errors"] == []
        assert pair["problem"] in pair["prompt"]
        code = extract_code(pair["completion"])
        assert code and "@triton.jit" in code and pair["kernel_count"] == 1
        assert pair["speedup_vs_eager"] == 1.5
    assert pairs[1]["ops"] == ["matmul", "sigmoid"] and pairs[1]["kernels"] == [
        ["matmul", "sigmoid"]
    ]
    rejects = [
        json.loads(line) for line in (tmp_path / "pairs.rejected.jsonl").read_text().splitlines()
    ]
    assert [(r["program_id"], r["verdict"]) for r in rejects] == [("c", "untranslatable")]
    assert "torch.exp" in rejects[0]["errors"][0]
    assert summary.correct == 2 and summary.programs == 3 and verifier.calls == 2
    assert summary.by_operator["matmul"]["correct"] == 1
    assert "2/3 programs verified correct" in summary.table()
    assert not (tmp_path / "pairs.jsonl.partial").exists()

    again = build_pairs(read_programs(_records(tmp_path)), out, verifier, progress=False)
    assert again.programs == 0 and again.skipped == 3 and verifier.calls == 2
    assert len(out.read_text().splitlines()) == 2


def test_build_resumes_after_a_crash_mid_line(tmp_path: Path) -> None:
    out = tmp_path / "pairs.jsonl"
    partial = tmp_path / "pairs.jsonl.partial"
    verifier = LocalVerifier()
    build_pairs(read_programs(_records(tmp_path)), out, verifier, progress=False)
    first_line = out.read_text().splitlines()[0]
    out.unlink()
    partial.write_text(first_line + "\n" + '{"program_id": "b", "prom')  # torn write
    (tmp_path / "pairs.rejected.jsonl").unlink()
    verifier.calls = 0
    summary = build_pairs(read_programs(_records(tmp_path)), out, verifier, progress=False)
    assert summary.skipped == 1 and verifier.calls == 1
    assert [json.loads(line)["program_id"] for line in out.read_text().splitlines()] == ["a", "b"]


def test_build_stops_when_the_sandbox_is_down(tmp_path: Path) -> None:
    def broken(problem: str, candidate: str) -> Verdict:
        raise ConnectionError("no server")

    source = render([[4, 8]], ["torch.relu({0})"])
    records = [{"id": str(i), "source": source} for i in range(30)]
    with pytest.raises(SandboxDown, match="no server"):
        build_pairs(records, tmp_path / "pairs.jsonl", broken, progress=False, jobs=2)
    assert (tmp_path / "pairs.jsonl.partial").exists()  # kept for the rerun
    assert not (tmp_path / "pairs.jsonl").exists()


@pytest.mark.slow
def test_build_through_the_sandbox(tmp_path: Path) -> None:
    """End to end with the real (in-process) sandbox on CPU."""
    api = pytest.importorskip("sandbox.api")

    def verify(problem: str, candidate: str) -> Verdict:
        return api.verify(
            problem, candidate, device="cpu", allow_weak_isolation=True, trials=2, timing=False
        )

    records = [
        {"id": "relu", "source": render([[4, 8]], ["torch.relu({0})"])},
        {
            "id": "add",
            "source": render([[3, 1, 5], [4, 5]], ["torch.add({0}, {1})", "F.silu({2})"]),
        },
    ]
    summary = build_pairs(records, tmp_path / "pairs.jsonl", verify, progress=False)
    assert summary.correct == 2, summary.table()
