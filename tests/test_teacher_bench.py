"""The teacher benchmark: statistics, targets, reports rebuilt from JSONL, and --resume."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench import teacher_bench as tb


def _result(
    pid: str,
    level: int,
    ops: list[str],
    families: list[str],
    verdict: str = "correct",
    eager: float | None = None,
    compiled: float | None = None,
    kernels: int | None = 1,
    message: str = "",
) -> tb.Result:
    return tb.Result(
        program_id=pid,
        level=level,
        ops=ops,
        families=families,
        family=tb.main_family(families),
        verdict=verdict,
        message=message,
        kernel_count=kernels,
        speedup_vs_eager=eager,
        speedup_vs_compile=compiled,
    )


def _results() -> list[tb.Result]:
    relu = [
        _result(f"r{i}", 1, ["relu"], ["pointwise"], eager=s, compiled=s / 2)
        for i, s in enumerate([1.0, 1.2, 1.4, 1.6, 1.8])
    ]
    return [
        *relu,
        _result("s0", 1, ["sum"], ["reduction"], eager=0.8, compiled=0.5),
        _result("s1", 1, ["sum"], ["reduction"], "wrong_output", message="trial 0: bad\nmore"),
        _result("n0", 1, ["layer_norm"], ["norm"], eager=1.1, compiled=0.9),
        _result("f0", 2, ["matmul", "relu"], ["matmul", "pointwise"], eager=1.5, compiled=1.0),
        _result("f1", 2, ["add", "sigmoid"], ["pointwise", "pointwise"], eager=1.3),
        _result("u0", 2, ["sum", "softmax"], ["reduction", "softmax"], eager=3.0, kernels=2),
    ]


META = {
    "profile": "paper",
    "seed": 0,
    "per_op": 5,
    "level2": 4,
    "workers": 4,
    "trials": 5,
    "timing": True,
    "timing_runs": 50,
    "device": "cuda",
    "gpu": "NVIDIA H200",
    "ops": ["relu", "sum", "layer_norm"],
    "planned": {"1": 8, "2": 4},
}


def _write_log(path: Path, results: list[tb.Result], end: dict | None) -> None:
    lines = [json.dumps({"kind": "meta", **META})]
    lines += [json.dumps({"kind": "result", **dataclasses.asdict(r)}) for r in results]
    if end is not None:
        lines.append(json.dumps({"kind": "end", **end}))
    path.write_text("\n".join(lines) + "\n")


def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert tb.percentile(values, 0.1) == pytest.approx(1.4)
    assert tb.percentile(values, 0.5) == pytest.approx(3.0)
    assert tb.percentile(values, 0.9) == pytest.approx(4.6)
    assert tb.percentile([7.0], 0.9) == 7.0
    with pytest.raises(ValueError):
        tb.percentile([], 0.5)


def test_spread_skips_missing_values() -> None:
    assert tb.spread([None, None]) is None
    s = tb.spread([1.0, None, 3.0, float("nan")])
    assert s == tb.Spread(count=2, median=2.0, p10=pytest.approx(1.2), p90=pytest.approx(2.8))


def test_main_family_prefers_the_heaviest_operator() -> None:
    assert tb.main_family(["pointwise", "matmul"]) == "matmul"
    assert tb.main_family(["pointwise", "reduction", "norm"]) == "norm"
    assert tb.main_family(["pointwise"]) == "pointwise"
    assert tb.main_family([]) == ""


def test_interleave_spreads_the_second_list() -> None:
    assert tb.interleave([1, 2, 3, 4], ["a", "b"]) == [1, "a", 2, 3, "b", 4]
    assert tb.interleave([1, 2], []) == [1, 2]
    assert tb.interleave([], ["a"]) == ["a"]


def test_speedups_count_only_correct_programs() -> None:
    sums = [r for r in _results() if r.ops == ["sum"]]
    assert tb.speedups(sums, "speedup_vs_eager") == [0.8]


def test_target_lines() -> None:
    lines = tb.target_lines(_results(), timing=True, planned={1: 8, 2: 4})
    assert lines[0].startswith("- MISS: level 1 pass rate 100%") and "7/8" in lines[0]
    assert lines[1].startswith("- PASS: level 2 pass rate 100%") and "1 not run" in lines[1]
    # An ill-posed problem is left out of the rate; a sandbox failure keeps the target open.
    ill_posed = tb.Result("p-bad", 2, ["div"], ["pointwise"], "pointwise", "bad_problem")
    lines = tb.target_lines([*_results(), ill_posed], timing=True, planned={1: 8, 2: 4})
    assert lines[1].startswith("- PASS: level 2") and "1 not judged: ill-posed" in lines[1]
    lost = tb.Result("p-oom", 2, ["add"], ["pointwise"], "pointwise", "sandbox_error")
    lines = tb.target_lines([*_results(), lost], timing=True, planned={1: 8, 2: 4})
    assert lines[1].startswith("- MISS: level 2") and "1 not judged: sandbox" in lines[1]
    assert lines[2] == (
        "- PASS: median speedup vs eager >= 1.0x on elementwise (pointwise family), level 1 "
        "(measured 1.40x, n=5)"
    )
    assert lines[3].startswith("- MISS:") and "reduction" in lines[3] and "0.80x" in lines[3]
    assert lines[4].startswith("- PASS:") and "normalisation" in lines[4]
    # Fused level 2: f0 (1.5x) and f1 (1.3x); u0 ran two kernels for two operators.
    assert lines[5].startswith("- PASS: median speedup vs eager >= 1.3x on fused level-2")
    assert "(measured 1.40x, n=2)" in lines[5]


def test_target_lines_without_timing() -> None:
    lines = tb.target_lines(_results(), timing=False, planned={1: 8, 2: 3})
    assert all(line.startswith("- n/a:") for line in lines[2:])
    assert "no timing" in lines[2]


def test_family_speed_table_rows() -> None:
    level1 = [r for r in _results() if r.level == 1]
    table = tb.speed_table(tb.group_by(level1, lambda r: r.family), timing=True)
    pointwise = next(line for line in table if line.startswith("| pointwise |"))
    # programs, correct, timed, eager median/p10/p90, compile median/p10/p90
    assert pointwise == (
        "| pointwise | 5 | 5 | 5 | 1.40x | 1.08x | 1.72x | 0.70x | 0.54x | 0.86x |"
    )
    reduction = next(line for line in table if line.startswith("| reduction |"))
    assert reduction.startswith("| reduction | 2 | 1 | 1 | 0.80x")


def test_failures_are_capped_and_one_line() -> None:
    failures = [
        _result(f"x{i}", 1, ["relu"], ["pointwise"], "timeout", message="slow\nx") for i in range(5)
    ]
    lines = tb.failure_lines(failures, cap=3)
    assert lines[0] == "- `x0` L1 relu: timeout: slow"
    assert len(lines) == 4 and lines[-1].startswith("- ... and 2 more")
    assert tb.failure_lines(_results()[:5]) == ["none"]


def test_report_only_rebuilds_from_a_killed_run(tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    _write_log(log, _results(), end=None)
    with open(log, "a") as handle:
        handle.write('{"kind": "result", "program_id": "torn')  # killed mid-write
    out = tmp_path / "report.md"
    assert tb.main(["--report-only", str(log), "--out", str(out)]) == 0
    report = out.read_text()
    assert "The run did not finish (no end record): 11 of 12 programs have results." in report
    assert "- `s1` L1 sum: wrong_output: trial 0: bad" in report
    assert "| 1 | **all** | 8 | 7 | 87.5% | wrong_output 1 |" in report
    assert "| fused (fewer kernels than operators) | 2 | 2 | 2 | 1.40x" in report
    assert "| main operator: matmul | 1 | 1 | 1 | 1.50x" in report
    assert "| sum | reduction | 2 | 1 | 0.80x | 0.50x |" in report


def test_an_interrupted_run_still_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C (or a wall-clock limit's SIGINT) mid-run: what landed is reported, status 130."""
    _write_log(tmp_path / "results.jsonl", _results(), end=None)

    def interrupted(args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tb, "run", interrupted)
    assert tb.main(["--out-dir", str(tmp_path), "--no-progress"]) == 130
    report = (tmp_path / "report.md").read_text()
    assert "The run did not finish (no end record): 11 of 12 programs have results." in report
    assert "interrupted" in capsys.readouterr().err


def test_an_interrupted_run_with_nothing_logged_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tb, "run", interrupted)
    assert tb.main(["--out-dir", str(tmp_path / "none")]) == 130
    assert not (tmp_path / "none" / "report.md").exists()


def test_report_of_a_finished_run_says_what_was_skipped(tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    _write_log(log, _results()[:6], end={"elapsed_s": 60.0, "stopped": "past --max-seconds"})
    meta, results, end = tb.load_log(log)
    report = tb.render_report(meta, results, end)
    assert "Finished 6 of 12 programs in 60 s (0.10 per second); 6 not run" in report
    assert "(past --max-seconds)" in report
    assert "## Failures (0, first 50 listed)" in report


# -- --resume ----------------------------------------------------------------------------------

OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB"


def _resumed_log(path: Path) -> None:
    """A first run killed mid-line, then a resumed one that retried `i0` and ran `r9`."""
    first = [
        *_results()[:3],
        _result("i0", 1, ["relu"], ["pointwise"], "infrastructure_error", message="grader"),
        _result("o0", 1, ["sum"], ["reduction"], "resource_limit", message=OOM),
    ]
    _write_log(path, first, end={"elapsed_s": 30.0, "stopped": "past --max-seconds"})
    later = [
        _result("i0", 1, ["relu"], ["pointwise"], eager=2.0),
        _result("r9", 1, ["relu"], ["pointwise"]),
    ]
    with open(path, "a") as handle:
        handle.write(json.dumps({"kind": "resume", "workers": 2, "max_seconds": 400}) + "\n")
        for r in later:
            handle.write(json.dumps({"kind": "result", **dataclasses.asdict(r)}) + "\n")
        handle.write('{"kind": "result", "program_id": "s0", "lev')  # killed mid-write


def test_done_ids_from_a_killed_run(tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    _write_log(log, _results()[:4], end=None)
    with open(log, "a") as handle:
        handle.write('{"kind": "result", "program_id": "torn", "level": 1')
    meta, results, end = tb.load_log(log)
    assert meta["seed"] == 0 and end is None
    assert tb.done_ids(results) == {"r0", "r1", "r2", "r3"}


def test_infrastructure_failures_are_not_done() -> None:
    results = [
        _result("ok", 1, ["relu"], ["pointwise"]),
        _result("wrong", 1, ["relu"], ["pointwise"], "wrong_output", message="trial 0"),
        _result("infra", 1, ["relu"], ["pointwise"], "infrastructure_error", message="down"),
        _result("grader", 1, ["relu"], ["pointwise"], "sandbox_error", message="grader error"),
        _result("oom", 1, ["relu"], ["pointwise"], "resource_limit", message=OOM),
        _result("ram", 1, ["relu"], ["pointwise"], "resource_limit", message="memory limit"),
    ]
    assert tb.done_ids(results) == {"ok", "wrong", "ram"}


def test_retry_judges_chosen_verdicts_again() -> None:
    results = [
        _result("ok", 1, ["relu"], ["pointwise"]),
        _result("slow", 1, ["layer_norm"], ["norm"], "timeout", message="budget"),
        _result("wrong", 1, ["relu"], ["pointwise"], "wrong_output", message="trial 0"),
    ]
    assert tb.done_ids(results) == {"ok", "slow", "wrong"}
    assert tb.done_ids(results, frozenset({"timeout"})) == {"ok", "wrong"}


def test_rejudge_judges_programs_made_only_of_chosen_operators_again() -> None:
    results = [
        _result("relu", 1, ["relu"], ["pointwise"]),
        _result("pair", 2, ["relu", "sigmoid"], ["pointwise"]),
        _result("mixed", 2, ["relu", "softmax"], ["pointwise", "softmax"]),
        _result("norm", 1, ["layer_norm"], ["norm"]),
    ]
    rejudge = frozenset({"relu", "sigmoid"})
    assert tb.done_ids(results, rejudge=rejudge) == {"mixed", "norm"}


def test_rejudge_cut_short_goes_on_where_it_stopped() -> None:
    rejudge = frozenset({"relu"})
    old = _result("old", 1, ["relu"], ["pointwise"])
    new = dataclasses.replace(_result("new", 1, ["relu"], ["pointwise"]), label="abc123")
    assert tb.done_ids([old, new], rejudge=rejudge, label="abc123") == {"new"}
    assert tb.done_ids([old, new], rejudge=rejudge, label="def456") == set()


def test_rejudge_takes_families_for_all_their_operators() -> None:
    from synth.teacher.parse import OPERATORS

    chosen = tb.parse_args(["--quick", "--resume", "--rejudge", "pointwise,softmax"]).rejudge
    assert {"relu", "sigmoid", "add", "softmax"} <= chosen
    assert all(OPERATORS[name].family in ("pointwise", "softmax") for name in chosen)
    assert "sum" not in chosen and "layer_norm" not in chosen


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--retry", "timeout"], "--retry needs --resume"),
        (["--resume", "--retry", "timeout,correct"], "not correct"),
        (["--resume", "--retry", "timout"], "not timout"),
        (["--rejudge", "relu"], "--rejudge needs --resume"),
        (["--resume", "--rejudge", "relu,rleu"], "not rleu"),
    ],
)
def test_bad_retry_verdicts_are_usage_errors(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        tb.parse_args(["--quick", *argv])
    assert exit_info.value.code == 2 and fragment in capsys.readouterr().err


def test_a_resumed_log_counts_each_program_once(tmp_path: Path) -> None:
    log = tmp_path / "results.jsonl"
    _resumed_log(log)
    meta, results, end = tb.load_log(log)
    assert end is None  # the first run's end record is not the resumed run's
    assert [r.program_id for r in results] == ["r0", "r1", "r2", "i0", "o0", "r9"]
    assert next(r for r in results if r.program_id == "i0").correct  # the retry's result
    assert meta["earlier_results"] == 4 and len(meta["resumes"]) == 1
    assert tb.done_ids(results) == {"r0", "r1", "r2", "i0", "r9"}  # o0 is retried again
    header = tb.render_report(meta, results, end).split("\n\n")[1]
    assert "4, 2 workers" in header  # the workers of each run
    assert "Resumed 1 time(s): 4 of these 6 results come from earlier runs" in header
    assert "6 of 12 programs have results (4 from earlier runs)." in header
    with open(log, "a") as handle:
        handle.write('\n{"kind": "end", "elapsed_s": 20.0, "stopped": ""}\n')
    meta, results, end = tb.load_log(log)
    report = tb.render_report(meta, results, end)
    assert (
        "Finished 6 of 12 programs (4 from earlier runs; this run 2 in 20 s, 0.10 per second)"
        in report
    )


def test_setting_mismatches_name_the_setting() -> None:
    current = {**META, "seed": 1, "ops": ["relu"], "workers": 2, "planned": {1: 8, 2: 4}}
    assert tb.setting_mismatches(META, current, tb.RESUME_SETTINGS) == [
        "seed: earlier run 0, this run 1",
        'ops: earlier run ["relu", "sum", "layer_norm"], this run ["relu"]',
    ]  # workers may change; planned's int keys compare equal to the file's string keys
    assert tb.setting_mismatches(META, current, ("planned", "programs_digest")) == []
    digest = tb.setting_mismatches(
        {**META, "programs_digest": "a"}, {"programs_digest": "b"}, ["programs_digest"]
    )
    assert len(digest) == 1 and digest[0].startswith("programs_digest: the same settings generate")


def test_resume_refuses_other_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "results.jsonl"
    _write_log(log, _results(), end=None)
    before = log.read_text()
    argv = [
        "--resume",
        "--out-dir",
        str(tmp_path),
        "--device",
        "cpu",
        "--ops",
        "relu,sum,layer_norm",
    ]
    assert tb.main([*argv, "--per-op", "5", "--level2", "4", "--timing-runs", "50"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err
    for setting in ("device:", "timing:", 'gpu: earlier run "NVIDIA H200", this run ""'):
        assert setting in err
    assert "profile:" not in err and "seed:" not in err and "workers:" not in err
    assert log.read_text() == before  # refused: nothing cleared or appended


def test_prune_pairs_keeps_only_done_programs(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl.partial"
    rejects = tmp_path / "pairs.rejected.jsonl"
    pairs.write_text('{"program_id": "a"}\n{"program_id": "b"}\n{"program_id": "c"')
    rejects.write_text(
        '{"program_id": "o", "errors": ["CUDA out of memory"]}\n{"program_id": "w"}\n'
    )
    tb._prune_pairs(tmp_path, {"a", "w", "c"})
    assert pairs.read_text() == '{"program_id": "a"}\n'
    assert rejects.read_text() == '{"program_id": "w"}\n'


def test_quick_run_then_resume_runs_nothing_again(tmp_path: Path) -> None:
    """End to end on CPU (sandbox, Triton interpreter): two programs, then a resume."""
    argv = ["--quick", "--ops", "relu", "--per-op", "2", "--level2", "0", "--allow-weak-isolation"]
    argv += ["--no-progress", "--out-dir", str(tmp_path)]
    assert tb.main(argv) == 0
    log = tmp_path / "results.jsonl"
    first = log.read_text()
    assert first.count('"kind": "result"') == 2
    assert tb.main([*argv, "--resume"]) == 0
    lines = log.read_text()[len(first) :].splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["resume", "end"]
    report = (tmp_path / "report.md").read_text()
    assert "Finished 2 of 2 programs (2 from earlier runs; this run 0 in" in report
    assert tb.main([*argv, "--resume", "--seed", "3"]) == 2
    # A program that timed out is judged again when asked, and its new result counts.
    text = log.read_text()
    log.write_text(text.replace('"verdict": "correct"', '"verdict": "timeout"', 1))
    assert tb.main([*argv, "--resume", "--retry", "timeout"]) == 0
    added = [json.loads(line) for line in log.read_text().splitlines()[len(text.splitlines()) :]]
    assert [line["kind"] for line in added] == ["resume", "result", "end"]
    _, results, _ = tb.load_log(log)
    assert len(results) == 2 and all(r.correct for r in results)


def test_memory_lines_compare_peaks_with_io_and_reservation() -> None:
    measured = _result("m0", 1, ["relu"], ["pointwise"], eager=1.0)
    measured.gpu_memory_gib = {
        "io": 8.0,
        "reserved": 40.0,
        "grader_peak": 24.0,
        "candidate_peak": 8.0,
    }
    untimed = _result("m1", 1, ["relu"], ["pointwise"], eager=1.0)  # a CPU run: no figures
    lines = tb.memory_lines([measured, untimed])
    assert lines[2] == "| grader peak / I/O | 1 | 3.00 | 3.00 | 3.00 |"
    assert lines[3] == "| candidate peak / I/O | 1 | 1.00 | 1.00 | 1.00 |"
    assert lines[4] == "| both peaks / reserved | 1 | 0.80 | 0.80 | 0.80 |"
    assert tb.memory_lines([untimed]) == []
    report = tb.render_report({**META, "label": "abc1234"}, [measured], None)
    assert "## GPU memory per job" in report and "Runs: `abc1234`." in report


def test_a_run_is_labelled_with_the_commit_unless_told_otherwise() -> None:
    import re

    assert re.fullmatch(r"([0-9a-f]{7,}\+?)?", tb.parse_args(["--quick"]).label)
    assert tb.parse_args(["--quick", "--label", "after the fix"]).label == "after the fix"
