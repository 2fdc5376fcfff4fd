"""The problems an evaluation runs on: synthetic levels or KernelBench-format problems.

`synthetic`: programs made by synth's generator with a fixed seed per level, so two runs
(two policies, with and without search) see the same programs. `kernelbench`: the records
of `drtriton synth kernelbench` (a JSONL file, or a directory of `Model` / `get_inputs`
problems converted first through that command); a problem whose export failed stays in the
suite with its reason, to be scored as a failure, never dropped.

Both are made by `drtriton synth ...` in a child process: the generator and torch.export
need torch, which the learner's process never loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SUITES = ("synthetic", "kernelbench")
PROFILES = ("tiny", "paper")
# Distinct from the generator's default seed (0), so that training sets made with the
# defaults are not the evaluation programs.
SYNTHETIC_SEED = 4545
REPO_ROOT = Path(__file__).resolve().parents[2]


class SuiteError(ValueError):
    """The suite cannot be built (bad levels, a missing or malformed problems file)."""


@dataclass(frozen=True)
class EvalProblem:
    """One problem: its source in the functional format, or why it could not be made."""

    id: str
    name: str
    level: int | None
    source: str
    export_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(record: dict[str, Any]) -> EvalProblem:
        return EvalProblem(
            id=str(record["id"]),
            name=str(record.get("name") or record["id"]),
            level=record.get("level"),
            source=record.get("source") or "",
            export_error=record.get("export_error"),
        )


def parse_levels(text: str) -> tuple[int, ...]:
    """ "1,2,5,20" -> (1, 2, 5, 20); SuiteError for anything else."""
    try:
        levels = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise SuiteError(f"--levels wants comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise SuiteError(f"--levels wants positive integers, got {text!r}")
    return tuple(dict.fromkeys(levels))


def synthetic_problems(
    levels: Sequence[int],
    count: int,
    profile: str = "tiny",
    seed: int = SYNTHETIC_SEED,
    *,
    workers: int = 1,
) -> list[EvalProblem]:
    """`count` generated programs per level, the same for the same (levels, count, profile,
    seed) on any machine and for any number of `workers`."""
    if count < 1:
        raise SuiteError(f"--count must be at least 1, got {count}")
    problems = []
    with tempfile.TemporaryDirectory(prefix="eval-programs-") as tmp:
        for level in levels:
            out = Path(tmp) / f"level{level}.jsonl"
            args = ["--level", str(level), "--count", str(count), "--seed", str(seed)]
            args += ["--profile", profile, "--workers", str(workers), "--out", str(out)]
            run_drtriton(["synth", "generate", *args, "--quiet"], f"level {level}")
            for line in out.read_text().splitlines():
                record = json.loads(line)
                name = "+".join(record["ops"])
                problems.append(EvalProblem(record["id"], name, level, record["source"]))
    return _unique(problems)


def run_drtriton(args: list[str], what: str) -> None:
    """Run a `drtriton` command in a child process (the generator and torch.export need
    torch, which the learner's process does not load); SuiteError with its last line."""
    proc = subprocess.run(
        [sys.executable, "-m", "drtriton_cli", *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise SuiteError(f"{what}: {tail[0].removeprefix('drtriton: error: ')}")


def read_kernelbench_records(path: Path) -> list[EvalProblem]:
    """The records `drtriton synth kernelbench` writes (`id`, `name`, `level`, `source`,
    `ok`, `reason`); an `ok: false` record becomes a problem with its `export_error`."""
    if not path.is_file():
        raise SuiteError(f"{path}: no such problems file")
    problems = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            ok = bool(record.get("ok", True))
            problems.append(
                EvalProblem(
                    id=str(record["id"]),
                    name=str(record.get("name") or record["id"]),
                    level=None if record.get("level") is None else int(record["level"]),
                    source=(record.get("source") or "") if ok else "",
                    export_error=None if ok else str(record.get("reason") or "export failed"),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise SuiteError(f"{path}:{number}: not a KernelBench problem record ({err})") from None
        if problems[-1].export_error is None and not problems[-1].source.strip():
            raise SuiteError(f"{path}:{number}: problem {problems[-1].id} has no source")
    if not problems:
        raise SuiteError(f"{path}: no problems")
    return _unique(problems)


def convert_kernelbench_dir(directory: Path, out: Path) -> Path:
    """Export every problem under `directory` into `out` through `drtriton synth kernelbench`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    what = f"{directory}: KernelBench conversion failed"
    run_drtriton(["synth", "kernelbench", str(directory), "--out", str(out)], what)
    if not out.is_file():
        raise SuiteError(f"{what}: no {out} written")
    return out


def kernelbench_problems(path: Path, work_dir: Path | None = None) -> list[EvalProblem]:
    """Problems from a JSONL file, or from a directory converted into `work_dir` first."""
    if path.is_dir():
        if work_dir is None:
            work_dir = Path(tempfile.mkdtemp(prefix="kernelbench-"))
        path = convert_kernelbench_dir(path, work_dir / "kernelbench.jsonl")
    elif not path.exists():
        raise SuiteError(f"{path}: no such problems file or directory")
    return read_kernelbench_records(path)


def _unique(problems: list[EvalProblem]) -> list[EvalProblem]:
    seen: set[str] = set()
    for p in problems:
        if p.id in seen:
            raise SuiteError(f"problem id {p.id!r} appears twice")
        seen.add(p.id)
    return problems
