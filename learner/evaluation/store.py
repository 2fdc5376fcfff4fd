"""An evaluation's run directory: its settings, its problems, and one line per sample.

    RUN/settings.json    what was asked (a resume must ask the same)
    RUN/problems.jsonl   the suite's problems, fixed at the start (a resume reuses them)
    RUN/samples.jsonl    one line per verified sample, appended and flushed as it goes
    RUN/summary.json, RUN/report.md, RUN/speedup_curve.png   written by `report.py`

A run killed at any point leaves whole lines plus at most one cut line; a problem counts as
done when all its samples (`sample` 0 .. `of`-1) are on file. Reopening for a resume keeps
the done problems' lines and rewrites the file without the rest (atomically), so the
problems in flight when the run died are simply made again (so are problems with a
`sandbox_error` sample: a fleet outage is mended by resuming).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, TextIO

from learner.evaluation.metrics import ProblemOutcome, SampleOutcome
from learner.evaluation.suites import SYNTHETIC_SEED, EvalProblem

SETTINGS_FILE = "settings.json"
PROBLEMS_FILE = "problems.jsonl"
SAMPLES_FILE = "samples.jsonl"
MESSAGE_CHARS = 2000
# Verdicts that a resume judges again: the fleet could not judge, the kernel may be fine.
RETRIED_VERDICTS = frozenset({"sandbox_error"})


class RunDirError(ValueError):
    """The run directory cannot be used as asked (another run there, different settings)."""


@dataclass(frozen=True)
class EvalSettings:
    """Everything that decides a run's results; a resume must match it field for field."""

    suite: str = "synthetic"
    levels: tuple[int, ...] = (1, 2, 5, 20)
    profile: str = "tiny"
    count: int = 10
    seed: int = SYNTHETIC_SEED
    problems: str | None = None
    policy: str = "teacher"
    samples: int = 1
    search: bool = False
    max_fragment_ops: int = 5
    timing: bool = True
    trials: int = 3
    batch: int = 8
    max_new_tokens: int | None = None  # None: the policy's own default
    temperature: float | None = None

    def normalized(self) -> EvalSettings:
        """Fields the suite ignores set to fixed values, so they never fail a resume."""
        if self.suite == "kernelbench":
            return _replace(self, levels=(), profile="", count=0)
        return _replace(self, problems=None)

    def policy_options(self) -> dict[str, Any]:
        """Sampling options for the policy; those left unset are not passed (the teacher
        takes none, so setting one for it is an error)."""
        options = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature}
        return {key: value for key, value in options.items() if value is not None}

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["levels"] = list(self.levels)
        return record

    @staticmethod
    def from_dict(record: dict[str, Any]) -> EvalSettings:
        known = {f.name for f in fields(EvalSettings)}
        values = {k: v for k, v in record.items() if k in known}
        values["levels"] = tuple(values.get("levels", ()))
        return EvalSettings(**values)


def _replace(settings: EvalSettings, **changes: Any) -> EvalSettings:
    return EvalSettings(**{**asdict(settings), **changes})


def settings_differences(old: EvalSettings, new: EvalSettings) -> list[str]:
    """ "name: old -> new" for every field that differs."""
    a, b = old.to_dict(), new.to_dict()
    return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k]]


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl_text(records: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def read_settings(run_dir: Path) -> EvalSettings | None:
    path = run_dir / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        return EvalSettings.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as err:
        raise RunDirError(f"{path}: unreadable settings ({err})") from None


def read_problems(run_dir: Path) -> list[EvalProblem]:
    path = run_dir / PROBLEMS_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir}: not an evaluation run (no {PROBLEMS_FILE})")
    try:
        return [EvalProblem.from_dict(json.loads(x)) for x in path.read_text().splitlines() if x]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise RunDirError(f"{path}: unreadable problems ({err})") from None


def read_sample_lines(path: Path) -> list[dict[str, Any]]:
    """The whole JSON lines of a samples file; a cut last line is left out."""
    if not path.is_file():
        return []
    records = []
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the line being written when the run stopped
            raise RunDirError(f"{path}:{number}: not a JSON line") from None
    return records


def complete_samples(
    records: Sequence[dict[str, Any]], redo: frozenset[str] = frozenset()
) -> dict[str, list[dict[str, Any]]]:
    """Per problem id, its sample lines in sample order, for problems with all of them
    and none whose verdict is in `redo`."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    expected: dict[str, int] = {}
    for r in records:
        groups.setdefault(r["problem"], {})[int(r["sample"])] = r
        expected[r["problem"]] = int(r["of"])
    return {
        pid: [got[i] for i in range(expected[pid])]
        for pid, got in groups.items()
        if set(got) == set(range(expected[pid]))
        and not any(r["verdict"] in redo for r in got.values())
    }


def check_run(run_dir: Path, settings: EvalSettings, *, resume: bool) -> bool:
    """True when `run_dir` holds this run (to be resumed), False when it holds none.
    RunDirError when it holds a run and `resume` is off, or one with other settings."""
    old = read_settings(run_dir)
    if old is None:
        return False
    if not resume:
        raise RunDirError(
            f"{run_dir} holds an evaluation run: pass --resume to continue it, or another --out"
        )
    changed = settings_differences(old, settings)
    if changed:
        raise RunDirError(f"{run_dir} was run with other settings ({'; '.join(changed)})")
    if not (run_dir / PROBLEMS_FILE).is_file():
        raise RunDirError(f"{run_dir}: {SETTINGS_FILE} without {PROBLEMS_FILE}")
    return True


def start_run(run_dir: Path, settings: EvalSettings, problems: Sequence[EvalProblem]) -> None:
    """A fresh run: its problems, then its settings (which mark the directory as a run),
    and an empty samples file."""
    write_atomic(run_dir / PROBLEMS_FILE, jsonl_text(p.to_dict() for p in problems))
    write_atomic(run_dir / SAMPLES_FILE, "")
    write_atomic(run_dir / SETTINGS_FILE, json.dumps(settings.to_dict(), indent=2) + "\n")


def reopen_samples(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The done problems' sample lines; the file is rewritten to hold only those. A
    problem with a `sandbox_error` sample (the fleet failed, not the kernel) is made again."""
    path = run_dir / SAMPLES_FILE
    done = complete_samples(read_sample_lines(path), redo=RETRIED_VERDICTS)
    write_atomic(path, jsonl_text(r for lines in done.values() for r in lines))
    return done


def sample_line(
    problem: EvalProblem,
    index: int,
    of: int,
    verdict: str,
    *,
    speedup_vs_eager: float | None = None,
    speedup_vs_compile: float | None = None,
    message: str = "",
    code: str | None = None,
) -> dict[str, Any]:
    return {
        "problem": problem.id,
        "level": problem.level,
        "sample": index,
        "of": of,
        "verdict": verdict,
        "speedup_vs_eager": speedup_vs_eager,
        "speedup_vs_compile": speedup_vs_compile,
        "message": message[:MESSAGE_CHARS],
        "code": code,
    }


def append_lines(handle: TextIO, lines: Sequence[dict[str, Any]]) -> None:
    """One problem's lines, written and flushed together."""
    handle.write(jsonl_text(lines))
    handle.flush()


def outcome_of(problem: EvalProblem, lines: Sequence[dict[str, Any]]) -> ProblemOutcome:
    return ProblemOutcome(
        problem_id=problem.id,
        level=problem.level,
        samples=tuple(
            SampleOutcome(r["verdict"], r.get("speedup_vs_eager"), r.get("speedup_vs_compile"))
            for r in lines
        ),
    )


def read_outcomes(run_dir: Path) -> list[ProblemOutcome]:
    """The outcomes of the run's done problems, in problem order."""
    done = complete_samples(read_sample_lines(run_dir / SAMPLES_FILE))
    return [outcome_of(p, done[p.id]) for p in read_problems(run_dir) if p.id in done]
