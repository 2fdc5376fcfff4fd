"""`drtriton demo`: its stages against the real command line, reuse and resume, the report,
the one-line errors, and the first two stages for real (programs, teacher pairs).

The whole loop at its smallest size is in test_demo_loop.py (slow)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import pytest

import drtriton_cli
from drtriton_demo import environment, manifest, pipeline, results
from drtriton_demo.execute import StageFailed, run_command
from drtriton_demo.sizes import SIZES, size_for
from drtriton_demo.stages import STAGE_NAMES, TEACHER, TRAINED, DemoPaths, plan, search_problems

FILLED = {"server": "127.0.0.1:50099", "gpu_gate": ""}


def _parse(args: list[str]) -> argparse.Namespace:
    return drtriton_cli.build_parser().parse_args(args)


# -- the plan ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size_name", sorted(SIZES))
def test_every_stage_command_is_accepted_by_the_command_line(size_name: str, tmp_path: Path):
    """Each planned command parses with `drtriton`'s own parser, and each training command's
    `--set` values make a valid config with the demo's sizes in it."""
    from learner.train.cli import load_cli_config

    size = SIZES[size_name]
    stages = plan(size, DemoPaths(tmp_path), seed=3)
    assert [s.name for s in stages] == list(STAGE_NAMES)
    for stage in stages:
        for command in stage.commands:
            args = _parse(command.filled(FILLED))
            assert callable(args.handler), command.args
    sft, rl = (_parse(s.commands[0].filled(FILLED)) for s in stages[2:4])
    sft_cfg, rl_cfg = load_cli_config(sft), load_cli_config(rl)
    assert sft_cfg.optim.total_steps == size.sft_steps
    assert sft_cfg.sandbox.servers == (FILLED["server"],) == rl_cfg.sandbox.servers
    assert rl_cfg.rl.max_steps == size.rl_steps and rl_cfg.rl.levels == size.rl_levels
    assert rl_cfg.model.path == str(tmp_path / "sft" / "model")
    assert rl_cfg.rl.gpu_gate_dir == ""  # filled in at run time: the server's gate on a GPU
    assert rl_cfg.sandbox.timing is size.timing
    # every policy the search and evaluation stages name is the teacher or the RL run's model
    policies = {_parse(c.filled(FILLED)).policy for s in stages[4:] for c in s.commands}
    assert policies == {"teacher", f"checkpoint:{tmp_path / 'rl' / 'model'}"}


def test_the_gpu_size_times_kernels_and_the_cpu_size_does_not(tmp_path: Path) -> None:
    """Search and evaluation are timed on a GPU; teacher pairs never need to be."""
    for name, timed in (("gpu", True), ("cpu", False)):
        stages = {s.name: s for s in plan(SIZES[name], DemoPaths(tmp_path))}
        for stage in ("search", "eval", "pairs"):
            flags = ["--no-timing" in c.args for c in stages[stage].commands]
            assert flags == [stage == "pairs" or not timed] * len(flags), (name, stage)
    assert SIZES["gpu"].preset == "100m-gpu" and SIZES["cpu"].preset == "tiny-cpu"
    assert size_for("auto", "cuda").name == "gpu" and size_for("auto", "cpu").name == "cpu"
    with pytest.raises(ValueError, match="unknown size"):
        size_for("huge", "cpu")


def test_stage_keys_name_what_a_stage_does(tmp_path: Path) -> None:
    paths = DemoPaths(tmp_path)
    first = [s.key(SIZES["cpu"]) for s in plan(SIZES["cpu"], paths)]
    assert first == [s.key(SIZES["cpu"]) for s in plan(SIZES["cpu"], paths)]
    assert len(set(first)) == len(first)
    other = [s.key(SIZES["smoke"]) for s in plan(SIZES["smoke"], paths)]
    assert not set(first) & set(other)
    reseeded = [s.key(SIZES["cpu"]) for s in plan(SIZES["cpu"], paths, seed=1)]
    assert reseeded[0] != first[0]


# -- reuse, resume, clean ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "exists", "upstream", "expected"),
    [
        ({"key": "k", "done": True}, True, False, manifest.REUSE),
        ({"key": "k", "done": True}, False, False, manifest.RESUME),
        ({"key": "k", "done": False}, True, False, manifest.RESUME),
        ({"key": "k", "done": True}, True, True, manifest.CLEAN),
        ({"key": "other", "done": True}, True, False, manifest.CLEAN),
        (None, True, False, manifest.CLEAN),
    ],
)
def test_decide(record, exists, upstream, expected) -> None:
    assert manifest.decide(record, "k", exists, upstream) == expected


class _FakeServer:
    def __init__(self) -> None:
        self.values: dict[str, str] | None = None
        self.time = None
        self.starts = 0

    def start(self) -> dict[str, str]:
        self.starts += 1
        self.values = dict(FILLED)
        self.time = results.StageTime("sandbox", "fake", 0.0, "ran")
        return self.values


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str) -> None:
        self.lines.append(text)

    def status(self, text: str):
        import contextlib

        class _Status:
            def update(self, text: str) -> None:
                pass

        return contextlib.nullcontext(_Status())


def _run(tmp_path: Path, size_name: str, calls: list[list[str]], fail: str = "") -> list[str]:
    """run_stages with every command recorded instead of run; `fail` makes that stage fail."""
    size = SIZES[size_name]
    paths = DemoPaths(tmp_path / "demo")
    record = manifest.Manifest.open(paths.root, fresh=False)

    def fake(args, log, *, env=None, on_output=None, ok=(0,), poll_s=0.5):
        if (
            fail
            and tuple(args[:2]) == plan(size, paths)[STAGE_NAMES.index(fail)].commands[0].args[:2]
        ):
            raise StageFailed("scripted failure")
        calls.append(list(args))
        return 0

    console = _Console()
    server = _FakeServer()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "run_command", fake)
        patch.setattr(pipeline, "AFTER", {})
        times = pipeline.run_stages(plan(size, paths), size, paths, record, server, {}, console)
    return [f"{t.name}:{t.how}" for t in times]


def test_a_rerun_reuses_finished_stages_resumes_a_cut_one_and_redoes_what_follows(
    tmp_path: Path,
) -> None:
    calls: list[list[str]] = []
    first = _run(tmp_path, "cpu", calls)
    assert first == ["programs:ran", "sandbox:ran", *(f"{n}:ran" for n in STAGE_NAMES[1:])]
    total = len(calls)
    assert total == sum(len(s.commands) for s in plan(SIZES["cpu"], DemoPaths(tmp_path)))

    calls.clear()
    assert _run(tmp_path, "cpu", calls) == [f"{n}:reused" for n in STAGE_NAMES]
    assert calls == []

    # RL cut short: it resumes with its files kept; search and eval start again, clean.
    root = tmp_path / "demo"
    (root / "rl" / "checkpoint-marker").write_text("kept")
    (root / "search" / "old-marker").write_text("stale")
    data = json.loads((root / "demo.json").read_text())
    data["stages"]["rl"]["done"] = False
    (root / "demo.json").write_text(json.dumps(data))
    calls.clear()
    third = _run(tmp_path, "cpu", calls)
    assert third[:4] == ["programs:reused", "pairs:reused", "sft:reused", "sandbox:ran"]
    assert third[4:] == ["rl:resumed", "search:ran", "eval:ran"]
    assert (root / "rl" / "checkpoint-marker").exists()
    assert not (root / "search" / "old-marker").exists()
    assert [c[:2] for c in calls][0] == ["train", "rl"]


def test_a_failed_stage_stops_the_loop_and_is_recorded_unfinished(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    with pytest.raises(StageFailed, match="scripted"):
        _run(tmp_path, "smoke", calls, fail="sft")
    stages = json.loads((tmp_path / "demo" / "demo.json").read_text())["stages"]
    assert stages["pairs"]["done"] and not stages["sft"]["done"] and "rl" not in stages
    # another size: nothing is reused
    calls.clear()
    assert all(t.endswith(":ran") for t in _run(tmp_path, "cpu", calls))


def test_the_output_directory_must_be_the_demos(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    for fresh in (False, True):
        with pytest.raises(manifest.ManifestError, match="not a demo directory"):
            manifest.Manifest.open(tmp_path, fresh=fresh)
    assert (tmp_path / "notes.txt").exists()
    demo = tmp_path / "demo"
    manifest.Manifest.open(demo, fresh=False).save()
    (demo / "x").write_text("")
    manifest.Manifest.open(demo, fresh=True)
    assert not (demo / "x").exists()
    with pytest.raises(manifest.ManifestError, match="outside"):
        manifest.remove_outputs(demo, (tmp_path / "notes.txt",))
    (demo / "demo.json").write_text("{torn")
    with pytest.raises(manifest.ManifestError, match="--fresh"):
        manifest.Manifest.open(demo, fresh=False)


# -- the report -------------------------------------------------------------------------------


def _summary(pass_at_1: float, speedup: float | None) -> dict:
    curve = [1.0 if speedup and x < speedup else 0.0 for x in (0.0, 1.0, 2.0)]
    return {
        "overall": {
            "problems": 6,
            "pass_at_k": {"1": pass_at_1},
            "faster1": {"eager": 0.5, "compile": 0.25},
            "mean_speedup": {"eager": speedup, "compile": None},
        },
        "curve": {"grid": [0.0, 1.0, 2.0], "eager": {"all": curve}, "compile": {"all": None}},
    }


def _results(tmp_path: Path, size_name: str) -> results.DemoResults:
    size = SIZES[size_name]
    out = results.DemoResults(size, "cpu", DemoPaths(tmp_path), pairs=21)
    out.evals = {TEACHER: _summary(1.0, 1.5), TRAINED: _summary(0.0, None)}
    out.searches = [
        results.SearchRow(
            "l3-0",
            ["bmm", "relu", "sub"],
            TEACHER,
            {"verdict": "correct", "converted_ops": 3, "total_ops": 3, "verification": "whole"},
        ),
        results.SearchRow("l3-0", ["bmm", "relu", "sub"], TRAINED, None),
    ]
    out.sft = results.sft_figures(
        [{"step": 40, "train/loss": 4.8}, {"step": 40, "eval/heldout_loss": 4.7}]
    )
    out.rl = results.rl_figures(
        [{"step": s, "rl/n_samples": 8, "rl/n_correct": s - 1, "rl/n_sent": 2} for s in (1, 2, 3)]
    )
    out.stages = [
        results.StageTime("programs", "p", 2.0, "reused"),
        results.StageTime("sft", "s", 30.0, "ran"),
    ]
    return out


def test_the_report_says_a_cpu_run_is_a_toy_and_speedups_are_not_timed(tmp_path: Path) -> None:
    text = results.markdown(_results(tmp_path, "cpu"))
    assert "trains a toy" in text and "pass@1 is not the point" in text
    teacher = next(line for line in text.splitlines() if line.startswith("| teacher |"))
    assert "| 100.0% |" in teacher and "n/a (not timed)" in teacher and "| 1/1 | 3/3 |" in teacher
    trained = next(line for line in text.splitlines() if line.startswith("| trained ("))
    assert "| 0.0% |" in trained and "| 0/0 |" not in trained  # its search outcome is missing
    assert "| l3-0 | bmm relu sub | trained | missing |" in text
    assert "train loss 4.800" in text and "held-out loss 4.700" in text
    assert "3/24 samples correct" in text and "6 sent to the sandbox" in text
    assert "| total | (stages run this time) | 30.0 |" in text


def test_the_gpu_report_shows_speedups_and_draws_the_curve(tmp_path: Path) -> None:
    gathered = _results(tmp_path, "gpu")
    text = results.markdown(gathered)
    assert "trains a toy" not in text and "bench/RESULTS.md" in text
    teacher = next(line for line in text.splitlines() if line.startswith("| teacher |"))
    assert "| 50.0% | 1.50x |" in teacher
    png = results.write_curve(gathered, tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_collect_reads_what_the_stages_wrote(tmp_path: Path) -> None:
    size = SIZES["smoke"]
    paths = DemoPaths(tmp_path)
    paths.pairs.mkdir(parents=True)
    paths.pairs_file(1).write_text('{"a": 1}\n{"a": 2}\n')
    paths.programs.mkdir(parents=True, exist_ok=True)
    paths.search_programs(2).write_text(json.dumps({"ops": ["add", "exp2"], "source": "x"}) + "\n")
    (paths.eval / TEACHER).mkdir(parents=True)
    (paths.eval / TEACHER / "summary.json").write_text(json.dumps(_summary(1.0, None)))
    problem = search_problems(size, paths)[0]
    outcome = paths.search / TEACHER / f"{problem.stem}.json"
    outcome.parent.mkdir(parents=True)
    outcome.write_text(json.dumps({"verdict": "correct", "converted_ops": 2, "total_ops": 2}))
    gathered = results.collect(size, "cpu", paths, [])
    assert gathered.pairs == 2
    assert gathered.evals[TEACHER]["overall"]["problems"] == 6 and gathered.evals[TRAINED] is None
    assert [(r.policy, r.ops, r.outcome is not None) for r in gathered.searches] == [
        (TEACHER, ["add", "exp2"], True),
        (TRAINED, ["add", "exp2"], False),
    ]


# -- errors: one line each --------------------------------------------------------------------


def test_a_missing_library_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(environment, "REQUIRED", {"ortools": "ortools", "no_such_mod_x": "jax"})
    status = drtriton_cli.main(["demo", "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err
    assert err.startswith("drtriton: error: the demo needs jax: run `make install`")
    assert not (tmp_path / "d").exists()


def test_cuda_without_a_gpu_and_a_foreign_directory_are_one_line(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(environment, "gpu_present", lambda: False)
    assert drtriton_cli.main(["demo", "--device", "cuda", "--out", str(tmp_path / "d")]) == 2
    assert "nvidia-smi lists no GPU" in capsys.readouterr().err
    (tmp_path / "mine.txt").write_text("")
    assert drtriton_cli.main(["demo", "--device", "cpu", "--out", str(tmp_path), "--fresh"]) == 2
    assert "not a demo directory" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").exists()


def test_a_failing_command_names_its_reason_and_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "x.log"
    args = ["synth", "generate", "--level", "1", "--count", "1", "--out", str(tmp_path / "no/x")]
    with pytest.raises(StageFailed) as caught:
        run_command(args, log, poll_s=0.05)
    message = str(caught.value)
    assert "`drtriton synth generate ...` exited with status 2" in message
    assert "drtriton: error:" in message and str(log) in message
    assert log.read_text().startswith("$ drtriton synth generate")
    assert run_command(args, log, ok=(2,), poll_s=0.05) == 2


def test_an_interrupt_stops_the_running_command(tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM, turned into the same) stops the stage's process, not just the demo."""
    marker = str(tmp_path / "interrupted.jsonl")
    args = ["synth", "generate", "--level", "20", "--count", "100000", "--out", marker]

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_command(args, tmp_path / "x.log", on_output=interrupt, poll_s=0.05)
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:
            continue
    assert alive == []

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), pipeline.terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    assert signal.getsignal(signal.SIGTERM) is previous


# -- the first stages for real ----------------------------------------------------------------


def test_programs_and_teacher_pairs_for_real_then_reused(tmp_path: Path, capsys) -> None:
    """The smoke size up to the pairs: programs generated, the search problems written, the
    teacher's kernels verified by a sandbox server the demo starts and stops; then reused."""
    out = tmp_path / "demo"
    options = pipeline.DemoOptions(out=out, size="smoke", device="cpu", until="pairs")
    assert pipeline.run_demo(options) == 0
    paths = DemoPaths(out)
    pairs = [json.loads(line) for line in paths.pairs_file(1).read_text().splitlines()]
    assert pairs and all(p["verdict"] == "correct" for p in pairs)
    problem = search_problems(SIZES["smoke"], paths)[0]
    assert "def fused_operator" in problem.read_text()
    stages = json.loads(paths.manifest.read_text())["stages"]
    assert set(stages) == {"programs", "pairs"} and all(s["done"] for s in stages.values())
    first = capsys.readouterr().err
    assert "✓ sandbox" in first and "✓ pairs" in first and "stopped after pairs" in first

    assert pipeline.run_demo(options) == 0
    again = capsys.readouterr().err
    assert again.count("(reused)") == 2 and "sandbox server" not in again
