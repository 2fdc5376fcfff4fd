"""`drtriton eval` end to end on CPU: a tiny synthetic suite, the teacher's kernels (and
junk) verified by a real local sandbox, the report files, resume after a kill, compare."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from drtriton_cli import main as drtriton
from learner.evaluation import report, store
from learner.evaluation.run import run_eval
from learner.evaluation.store import EvalSettings
from learner.evaluation.suites import SYNTHETIC_SEED
from tests.learner.evaluation.conftest import TeacherThenJunk

SETTINGS = EvalSettings(levels=(1, 2), count=2, samples=2, batch=2, trials=1)
FIGURES = ("problems_total", "problems_done", "overall", "levels", "curve")


def figures(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in FIGURES}


@pytest.fixture(scope="module")
def full_run(sandbox_server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sandbox.client import SandboxClient

    run_dir = tmp_path_factory.mktemp("eval") / "full"
    policy = TeacherThenJunk()
    with SandboxClient(sandbox_server, timeout_s=300) as client:
        run_eval(SETTINGS, run_dir, policy=policy, client=client, progress=False)
    # two batches of two problems, two samples each, batch b seeded seed + b
    assert policy.calls == [(2, 2, SYNTHETIC_SEED), (2, 2, SYNTHETIC_SEED + 1)]
    return run_dir


def test_a_synthetic_run_scores_every_sample(full_run: Path) -> None:
    lines = store.read_sample_lines(full_run / store.SAMPLES_FILE)
    assert len(lines) == 8
    by_sample = {(r["problem"], r["sample"]): r for r in lines}
    problems = store.read_problems(full_run)
    assert [p.level for p in problems] == [1, 1, 2, 2]
    for index, p in enumerate(problems):
        teacher, junk = by_sample[(p.id, 0)], by_sample[(p.id, 1)]
        assert teacher["verdict"] == "correct", teacher["message"]
        assert teacher["code"] and "triton" in teacher["code"]
        assert junk["verdict"] == ("no_code" if index % 2 == 0 else "syntax_error")
        assert teacher["speedup_vs_eager"] is None  # a CPU sandbox does not time


def test_the_report_files(full_run: Path) -> None:
    summary = json.loads((full_run / report.SUMMARY_FILE).read_text())
    overall = summary["overall"]
    assert overall["pass_at_k"] == {"1": 0.5, "2": 1.0}
    assert overall["faster1"] == {"eager": None, "compile": None}
    assert overall["verdicts"] == {"correct": 1.0}
    assert overall["sample_verdicts"] == {"correct": 4, "no_code": 2, "syntax_error": 2}
    assert sorted(summary["levels"]) == ["1", "2"]
    text = (full_run / report.REPORT_FILE).read_text()
    assert "| all | 4 | 4 | 50.0% | 100.0% | n/a | n/a |" in text
    assert "did not time kernels" in text
    assert (full_run / report.CURVE_FILE).read_bytes()[:4] == b"\x89PNG"


def test_resume_after_a_kill_gives_the_same_summary(
    full_run: Path, sandbox_client: Any, tmp_path: Path
) -> None:
    run_dir = tmp_path / "resumed"
    killed = TeacherThenJunk(fail_on_call=2)
    with pytest.raises(RuntimeError, match="simulated kill"):
        run_eval(SETTINGS, run_dir, policy=killed, client=sandbox_client, progress=False)
    assert len(store.read_sample_lines(run_dir / store.SAMPLES_FILE)) == 4  # batch 0 only
    with pytest.raises(store.RunDirError, match="--resume"):
        run_eval(SETTINGS, run_dir, policy=TeacherThenJunk(), client=sandbox_client)
    policy = TeacherThenJunk()
    summary = run_eval(
        SETTINGS, run_dir, resume=True, policy=policy, client=sandbox_client, progress=False
    )
    assert policy.calls == [(2, 2, SYNTHETIC_SEED + 1)]  # only the missing batch
    assert figures(summary) == figures(report.read_summary(full_run))
    # a finished run resumes to the same summary without asking anyone anything
    idle = TeacherThenJunk()
    again = run_eval(SETTINGS, run_dir, resume=True, policy=idle, client=None, progress=False)
    assert idle.calls == [] and figures(again) == figures(summary)

    out = tmp_path / "compare.md"
    assert drtriton(["eval", "compare", str(full_run), str(run_dir), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| all | pass@1 | 50.0% | 50.0% |" in text
    assert "| 2 | pass@2 | 100.0% | 100.0% |" in text


def test_the_command_line(
    sandbox_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policies: list[TeacherThenJunk] = []

    def load(spec: str) -> TeacherThenJunk:
        assert spec == "teacher"
        policies.append(TeacherThenJunk())
        return policies[-1]

    monkeypatch.setattr("learner.evaluation.cli.load_policy", load)
    run_dir = tmp_path / "cli"
    args = ["eval", "--levels", "1", "--count", "2", "--policy", "teacher", "--out", str(run_dir)]
    args += ["--server", sandbox_server, "--trials", "1", "--no-progress"]
    assert drtriton(args) == 0
    assert "| all | 2 | 2 | 100.0% |" in capsys.readouterr().out
    assert drtriton(args) == 2  # the run is there: --resume or another --out
    assert "--resume" in capsys.readouterr().err
    assert drtriton([*args, "--resume", "--samples", "2"]) == 2
    assert "samples: 1 -> 2" in capsys.readouterr().err
    assert drtriton([*args, "--resume"]) == 0
    assert [len(p.calls) for p in policies] == [1, 0, 0, 0]
    assert drtriton(["eval", "report", str(run_dir)]) == 0


def test_an_unknown_policy_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("learner.policies.registry")
    args = ["eval", "--levels", "1", "--count", "1", "--policy", "nosuch"]
    assert drtriton([*args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nosuch" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_sampling_options_reach_a_model_policy_and_not_the_teacher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("learner.policies.registry")
    args = ["eval", "--levels", "1", "--count", "1", "--temperature", "0"]
    assert drtriton([*args, "--policy", "teacher", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert "takes no option temperature" in err and len(err.splitlines()) == 1, err

    seen: dict[str, Any] = {}

    def fake_load(spec: str, **options: Any) -> Any:
        seen.update(options, spec=spec)
        raise KeyError("stop here")

    monkeypatch.setattr("learner.evaluation.run.load_policy", fake_load)
    extra = ["--max-new-tokens", "2048", "--policy", "checkpoint:/m", "--out", str(tmp_path / "c")]
    assert drtriton([*args, *extra]) == 2
    assert seen == {"spec": "checkpoint:/m", "max_new_tokens": 2048, "temperature": 0.0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--suite", "nosuch"], "unknown suite"),
        (["--suite", "kernelbench", "--problems", "/no/such/file.jsonl"], "no such problems"),
        (["--levels", "1,two"], "--levels"),
        (["--server", "127.0.0.1:1"], "no sandbox server serving"),
    ],
)
def test_bad_input_is_one_line_and_status_2(
    extra: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("learner.evaluation.cli.load_policy", lambda spec: TeacherThenJunk())
    args = ["eval", "--levels", "1", "--count", "1", "--policy", "teacher"]
    assert drtriton([*args, "--out", str(tmp_path / "x"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x" / store.SETTINGS_FILE).exists()  # nothing to --resume


def test_kernelbench_records_keep_their_export_failures(
    sandbox_client: Any, tmp_path: Path
) -> None:
    source = (
        "import torch\n\n\ndef get_inputs():\n    tensor_0 = torch.randn([6, 5])\n"
        "    return [tensor_0]\n\n\n"
        "def fused_operator(tensor_0):\n    tensor_1 = torch.relu(tensor_0)\n"
        "    return [tensor_1]\n"
    )
    records = [
        {"id": "1_relu", "name": "ReLU", "level": 1, "source": source, "ok": True, "reason": ""},
        {"id": "2_odd", "name": "Odd", "level": 1, "source": "", "ok": False, "reason": "no op"},
    ]
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in records))
    settings = EvalSettings(suite="kernelbench", problems=str(problems), trials=1)
    summary = run_eval(
        settings, tmp_path / "kb", policy=TeacherThenJunk(), client=sandbox_client, progress=False
    )
    assert summary["overall"]["verdicts"] == {"correct": 0.5, "export_failed": 0.5}
    assert summary["overall"]["pass_at_k"]["1"] == 0.5
    lines = store.read_sample_lines(tmp_path / "kb" / store.SAMPLES_FILE)
    assert [(r["problem"], r["verdict"], r["message"]) for r in lines][1] == (
        "2_odd",
        "export_failed",
        "no op",
    )


@dataclass
class FakeSearchOutcome:
    candidate: str | None
    verdict: str
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None


def test_search_mode_records_one_outcome_per_problem(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Search (faked: no sandbox needed) gives one verified candidate per problem; timed
    speedups flow into Faster1 and the curve."""
    from learner.search import run as search_run
    from learner.search.program import SearchError

    calls: list[dict[str, Any]] = []
    answers = iter(
        [
            ("correct", 1.6, 0.9),
            ("wrong_output", None, None),
            ("correct", 0.7, 0.5),
            SearchError("line 3: not a straight-line program"),
        ]
    )

    def search_problem(problem: str, policy: Any, client: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        verdict, eager, compile_ = answer
        return FakeSearchOutcome("code", verdict, eager, compile_)

    monkeypatch.setattr(search_run, "search_problem", search_problem)
    settings = EvalSettings(levels=(1,), count=4, samples=4, search=True, batch=2)
    summary = run_eval(
        settings, tmp_path / "s", policy=TeacherThenJunk(), client=object(), progress=False
    )
    assert [c["seed"] for c in calls] == [SYNTHETIC_SEED + i for i in range(4)]
    assert all(c["samples"] == 4 and c["max_fragment_ops"] == 5 for c in calls)
    overall = summary["overall"]
    assert overall["pass_at_k"] == {"1": pytest.approx(2 / 4)}  # search: one outcome each
    assert overall["faster1"] == {"eager": pytest.approx(1 / 4), "compile": 0.0}
    assert overall["mean_speedup"]["eager"] == pytest.approx((1.6 + 0.7) / 2)
    # A problem search cannot split is a failure with its reason, not a crash of the run.
    assert overall["verdicts"]["unsearchable"] == pytest.approx(1 / 4)


def test_the_registry_teacher_when_present(sandbox_server: str, tmp_path: Path) -> None:
    pytest.importorskip("learner.policies.registry")
    run_dir = tmp_path / "teacher"
    args = ["eval", "--levels", "1", "--count", "2", "--policy", "teacher", "--out", str(run_dir)]
    assert drtriton([*args, "--server", sandbox_server, "--trials", "1", "--no-progress"]) == 0
    assert report.read_summary(run_dir)["overall"]["pass_at_k"]["1"] == 1.0
