"""Data files carry verdict names; files that carry the enum's numbers still read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from sandbox.result import VERDICTS, verdict_name
from synth.teacher.build import build_pairs

from .programs import render


def test_names_pass_and_numbers_read_through_the_enum() -> None:
    assert verdict_name("correct") == "correct"
    assert verdict_name("WRONG_OUTPUT") == "wrong_output"
    assert verdict_name("untranslatable") == "untranslatable"  # the teacher's own
    assert verdict_name(7) == verdict_name("7") == "timeout"
    assert [verdict_name(pb.Verdict.Value(n.upper())) for n in VERDICTS] == list(VERDICTS)
    for bad in (0, 99, -1, True, None, 1.0, ["correct"]):
        with pytest.raises(ValueError, match="verdict"):
            verdict_name(bad)


@dataclass
class NumberedResult:
    """A verifier's result whose verdict is the enum's number, not its name."""

    verdict: int
    message: str = ""
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None


def test_build_writes_names_when_the_verifier_gives_numbers(tmp_path: Path) -> None:
    programs = [
        {"id": "a", "level": 1, "source": render([[4, 8]], ["torch.relu({0})"])},
        {"id": "b", "level": 1, "source": render([[4, 8]], ["torch.sigmoid({0})"])},
        {"id": "c", "level": 1, "source": render([[4, 8]], ["torch.tanh({0})"])},
    ]
    numbers = {"a": pb.CORRECT, "b": pb.TIMEOUT, "c": pb.WRONG_OUTPUT}
    verdicts = iter(numbers[p["id"]] for p in programs)

    def verify(problem: str, candidate: str) -> NumberedResult:
        return NumberedResult(next(verdicts), "", 1.5)

    out = tmp_path / "pairs.jsonl"
    summary = build_pairs(programs, out, verify, progress=False)
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    rejects = (tmp_path / "pairs.rejected.jsonl").read_text().splitlines()
    assert [p["verdict"] for p in pairs] == ["correct"]
    assert sorted(json.loads(line)["verdict"] for line in rejects) == ["timeout", "wrong_output"]
    assert dict(summary.verdicts) == {"correct": 1, "timeout": 1, "wrong_output": 1}


def test_an_unknown_verdict_number_is_an_infrastructure_failure(tmp_path: Path) -> None:
    programs = [{"id": "a", "level": 1, "source": render([[4, 8]], ["torch.relu({0})"])}]
    summary = build_pairs(
        programs, tmp_path / "p.jsonl", lambda p, c: NumberedResult(99), progress=False
    )
    assert dict(summary.verdicts) == {"infrastructure_error": 1}
    assert not (tmp_path / "p.jsonl").read_text()  # retried on a rerun, not recorded


def test_sft_data_reads_pairs_with_verdict_numbers(tmp_path: Path) -> None:
    sft_data = pytest.importorskip("learner.train.sft_data")
    from learner.train.data import DataError

    def pair(index: int, verdict: object) -> dict:
        source = render([[4, 8]], ["torch.relu({0})"])
        return {
            "program_id": f"p{index}",
            "level": 1,
            "ops": ["relu"],
            "prompt": f"Rewrite:\n{source}",
            "completion": "```python\npass\n```",
            "verdict": verdict,
            "problem": source,
        }

    path = tmp_path / "old.jsonl"
    lines = [pair(0, 1), pair(1, "correct"), pair(2, "9"), pair(3, 7)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    pairs, counts = sft_data.read_sft_pairs(path)
    assert [p.program_id for p in pairs] == ["p0", "p1"]
    assert counts.not_correct == {"wrong_output": 1, "timeout": 1}
    path.write_text(json.dumps(pair(0, 42)) + "\n")
    with pytest.raises(DataError, match=r"old\.jsonl:1: `verdict`: 42 is no verdict number"):
        sft_data.read_sft_pairs(path)


def test_teacher_bench_reads_results_with_verdict_numbers() -> None:
    teacher_bench = pytest.importorskip("bench.teacher_bench")
    fields = {"program_id": "a", "level": 1, "ops": ["relu"], "families": ["pointwise"]}
    result = teacher_bench.Result.from_dict({**fields, "family": "pointwise", "verdict": 7})
    assert result.verdict == "timeout"
    assert teacher_bench.Result.from_dict({**fields, "family": "x", "verdict": "correct"}).correct
