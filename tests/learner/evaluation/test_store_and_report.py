"""The run directory (resume after a cut, settings checks) and the report files, without a
sandbox: sample lines are written by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from learner.evaluation import report, store
from learner.evaluation.store import EvalSettings, RunDirError
from learner.evaluation.suites import EvalProblem

PROBLEMS = [
    EvalProblem("a", "relu", 1, "src a"),
    EvalProblem("b", "exp", 1, "src b"),
    EvalProblem("c", "add+tanh", 2, "src c"),
    EvalProblem("d", "conv", 2, "", export_error="unsupported op: aten.foo"),
]
# verdicts per problem (2 samples each, one for the export failure); speedups for a timed run
VERDICTS = {"a": ["correct", "correct"], "b": ["correct", "no_code"], "c": ["wrong_output"] * 2}
SPEEDUPS = {"a": [1.5, 0.5], "b": [0.8, None], "c": [None, None]}


def lines_for(problem: EvalProblem) -> list[dict]:
    if problem.export_error:
        return [store.sample_line(problem, 0, 1, "export_failed", message=problem.export_error)]
    return [
        store.sample_line(problem, i, 2, v, speedup_vs_eager=SPEEDUPS[problem.id][i], code="kernel")
        for i, v in enumerate(VERDICTS[problem.id])
    ]


def make_run(run_dir: Path, settings: EvalSettings) -> list[str]:
    assert store.check_run(run_dir, settings, resume=False) is False
    store.start_run(run_dir, settings, PROBLEMS)
    text = store.jsonl_text(line for p in PROBLEMS for line in lines_for(p))
    (run_dir / store.SAMPLES_FILE).write_text(text)
    return text.splitlines()


SETTINGS = EvalSettings(levels=(1, 2), count=2, samples=2).normalized()


def test_report_files_and_figures(tmp_path: Path) -> None:
    make_run(tmp_path, SETTINGS)
    summary = report.write_report(tmp_path)
    overall = summary["overall"]
    # pass@1 = (2/2 + 1/2 + 0 + 0) / 4; pass@2 = (1 + 1 + 0 + 0) / 4
    assert overall["pass_at_k"] == {"1": pytest.approx(0.375), "2": pytest.approx(0.5)}
    assert overall["faster1"]["eager"] == pytest.approx(0.25)  # only a (1.5x) beats eager
    assert overall["faster1"]["compile"] is None  # nothing timed against torch.compile
    assert overall["mean_speedup"]["eager"] == pytest.approx((1.5 + 0.8) / 2)
    assert overall["verdicts"]["export_failed"] == pytest.approx(0.25)
    assert summary["levels"]["2"]["pass_at_k"]["1"] == 0.0
    # level 2 has nothing correct: 0 against eager (the run was timed), n/a against compile
    assert summary["levels"]["2"]["faster1"] == {"eager": 0.0, "compile": None}
    assert summary["curve"]["compile"]["2"] is None
    assert summary["curve"]["eager"]["all"][0] == pytest.approx(0.5)
    assert json.loads((tmp_path / report.SUMMARY_FILE).read_text()) == summary
    text = (tmp_path / report.REPORT_FILE).read_text()
    assert "| all | 4 | 4 | 37.5% | 50.0% | 25.0% | n/a | 1.15x |" in text
    assert "export_failed" in text and "Partial run" not in text
    assert (tmp_path / report.CURVE_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_keeps_whole_problems_and_drops_a_cut_line(tmp_path: Path) -> None:
    lines = make_run(tmp_path, SETTINGS)
    # a, b done; c has one of its two lines; then a line cut by a kill.
    cut = "\n".join(lines[:5]) + "\n" + lines[5][: len(lines[5]) // 2]
    (tmp_path / store.SAMPLES_FILE).write_text(cut)
    assert store.check_run(tmp_path, SETTINGS, resume=True) is True
    done = store.reopen_samples(tmp_path)
    assert sorted(done) == ["a", "b"]
    kept = (tmp_path / store.SAMPLES_FILE).read_text().splitlines()
    assert kept == lines[:4]
    partial = report.write_report(tmp_path)
    assert (partial["problems_done"], partial["problems_total"]) == (2, 4)
    assert "Partial run: 2 of 4" in (tmp_path / report.REPORT_FILE).read_text()


def test_resume_judges_sandbox_errors_again(tmp_path: Path) -> None:
    lines = make_run(tmp_path, SETTINGS)
    records = [json.loads(x) for x in lines]
    records[2]["verdict"] = "sandbox_error"  # b's first sample: the fleet failed
    (tmp_path / store.SAMPLES_FILE).write_text(store.jsonl_text(records))
    assert sorted(store.reopen_samples(tmp_path)) == ["a", "c", "d"]


def test_a_cut_line_elsewhere_is_an_error(tmp_path: Path) -> None:
    lines = make_run(tmp_path, SETTINGS)
    (tmp_path / store.SAMPLES_FILE).write_text(lines[0][:10] + "\n" + lines[1] + "\n")
    with pytest.raises(RunDirError, match="not a JSON line"):
        store.reopen_samples(tmp_path)


def test_run_dir_refuses_other_settings_and_accidental_reuse(tmp_path: Path) -> None:
    make_run(tmp_path, SETTINGS)
    with pytest.raises(RunDirError, match="--resume"):
        store.check_run(tmp_path, SETTINGS, resume=False)
    other = EvalSettings(levels=(1, 2), count=2, samples=4).normalized()
    with pytest.raises(RunDirError, match="samples: 2 -> 4"):
        store.check_run(tmp_path, other, resume=True)
    # --resume on a fresh directory simply starts
    assert store.check_run(tmp_path / "fresh", SETTINGS, resume=True) is False


def test_settings_the_suite_ignores_never_fail_a_resume() -> None:
    a = EvalSettings(suite="kernelbench", problems="/p.jsonl", levels=(1,)).normalized()
    b = EvalSettings(suite="kernelbench", problems="/p.jsonl", levels=(5, 20)).normalized()
    assert store.settings_differences(a, b) == []
    assert EvalSettings.from_dict(a.to_dict()) == a


def test_compare_two_runs(tmp_path: Path) -> None:
    make_run(tmp_path / "a", SETTINGS)
    report.write_report(tmp_path / "a")
    lines = make_run(tmp_path / "b", SETTINGS)
    (tmp_path / "b" / store.SAMPLES_FILE).write_text("\n".join(lines[:4]) + "\n")
    report.write_report(tmp_path / "b")
    text = report.compare_runs(tmp_path / "a", tmp_path / "b")
    assert "| all | pass@1 | 37.5% | 75.0% |" in text  # b: a and b only, (1 + 1/2) / 2
    assert "| all | problems | 4 | 2 |" in text
    assert "| 2 | pass@1 | 0.0% |" not in text  # level 2 is in run a only
    assert "Levels in one run only: 2" in text
    with pytest.raises(report.ReportError):
        report.compare_runs(tmp_path / "a", tmp_path / "missing")
