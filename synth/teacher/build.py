"""Build the SFT dataset: translate programs, verify every pair, keep the correct ones.

Input is the generator's JSONL (one record per program, with at least `source`); the
output holds one JSON line per verified pair: `prompt` and `completion` (the exact
text the policy trains on), the verdict, errors, speedups, and where the pair came
from. Programs whose translation fails or is rejected go to a separate rejects file,
so the dataset itself contains only pairs the sandbox judged correct.

Writing is resumable and atomic: lines go to `OUT.partial` as they are verified (one
flushed line each), a rerun skips the programs already in it or in the rejects file,
and the finished file is moved into place with one rename. Infrastructure failures
(the sandbox could not judge) are not recorded, so a rerun retries them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from sandbox.result import verdict_name

from .parse import TranslationError
from .prompt import build_completion, build_prompt
from .translate import translate

# Verdicts about the sandbox rather than the kernel: not recorded, retried on a rerun.
RETRY_VERDICTS = frozenset({"sandbox_error"})
# This many infrastructure failures in a row means the sandbox is down: stop the run.
MAX_CONSECUTIVE_FAILURES = 20


class ProgramFileError(ValueError):
    """A line of the programs file is not a program record."""


class SandboxDown(RuntimeError):
    """The sandbox failed on many programs in a row; the run stops (and can be resumed)."""


class VerifyResultLike(Protocol):
    verdict: str | int  # a name; an enum number is read as its name
    message: str
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None


Verifier = Callable[[str, str], VerifyResultLike]


@dataclass
class Outcome:
    """What happened to one program."""

    program_id: str
    ops: list[str]
    # a sandbox verdict, "untranslatable" (outside the templates), "teacher_error" (a bug
    # in the teacher), or "infrastructure_error" (the sandbox failed; retried on a rerun)
    verdict: str
    record: dict[str, Any] | None = None
    speedup: float | None = None


@dataclass
class BuildSummary:
    """Counts per operator (a program counts once for each distinct operator in it)."""

    programs: int = 0
    skipped: int = 0  # already done in an earlier run
    correct: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    by_operator: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    speedups: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, outcome: Outcome) -> None:
        self.programs += 1
        self.verdicts[outcome.verdict] += 1
        self.correct += outcome.verdict == "correct"
        for op in dict.fromkeys(outcome.ops):
            self.by_operator[op]["programs"] += 1
            self.by_operator[op][outcome.verdict] += 1
            if outcome.speedup:
                self.speedups[op].append(outcome.speedup)

    def to_dict(self) -> dict[str, Any]:
        return {
            "programs": self.programs,
            "skipped": self.skipped,
            "correct": self.correct,
            "verdicts": dict(self.verdicts),
            "by_operator": {
                op: {**counts, "geomean_speedup_vs_eager": _geomean(self.speedups.get(op, []))}
                for op, counts in sorted(self.by_operator.items())
            },
        }

    def table(self) -> str:
        """A plain-text table: one row per operator, then the totals."""
        head = f"{'operator':<18}{'programs':>9}{'correct':>9}{'untransl.':>10}{'rejected':>9}{'speedup':>9}"
        lines = [head, "-" * len(head)]
        for op, counts in sorted(self.by_operator.items()):
            untranslated = counts["untranslatable"]
            rejected = (
                counts["programs"]
                - counts["correct"]
                - untranslated
                - counts["infrastructure_error"]
            )
            speed = _geomean(self.speedups.get(op, []))
            lines.append(
                f"{op:<18}{counts['programs']:>9}{counts['correct']:>9}{untranslated:>10}{rejected:>9}"
                f"{(f'{speed:.2f}x' if speed else '-'):>9}"
            )
        lines.append("-" * len(head))
        verdicts = ", ".join(f"{v}: {n}" for v, n in self.verdicts.most_common())
        lines.append(
            f"{self.correct}/{self.programs} programs verified correct"
            + (f" ({verdicts})" if verdicts else "")
            + (f"; {self.skipped} already done" if self.skipped else "")
        )
        return "\n".join(lines)


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def program_id(record: dict[str, Any]) -> str:
    """The generator's id when present, else a hash of the source."""
    return str(record.get("id") or hashlib.sha256(record["source"].encode()).hexdigest()[:16])


def read_programs(path: Path) -> Iterator[dict[str, Any]]:
    """Program records from a JSONL file (each needs `source`)."""
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ProgramFileError(f"{path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("source"), str):
                raise ProgramFileError(f"{path}:{number}: a program record needs a `source` string")
            yield record


def _recover(path: Path) -> set[str]:
    """Ids recorded in a JSONL file; a torn last line (a crash mid-write) is cut off."""
    if not path.exists():
        return set()
    ids, good = set(), 0
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                if not raw.endswith(b"\n"):
                    raise ValueError("torn line")
                ids.add(str(json.loads(raw)["program_id"]))
            except (ValueError, KeyError):
                break
            good += len(raw)
    if good != path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(good)
    return ids


def process(
    record: dict[str, Any], verify: Verifier, fatal: tuple[type[BaseException], ...] = ()
) -> Outcome:
    """Translate and verify one program (safe to run in a worker thread).

    Exceptions raised by `verify` count as infrastructure failures, except `fatal`
    ones (a misconfigured sandbox), which propagate.
    """
    source = record["source"]
    pid = program_id(record)
    base = {"program_id": pid, "level": record.get("level"), "ops": record.get("ops")}
    try:
        translation = translate(source)
    except Exception as err:  # noqa: BLE001 - one bad program must not stop a long run
        verdict = "untranslatable" if isinstance(err, TranslationError) else "teacher_error"
        message = str(err) if verdict == "untranslatable" else f"{type(err).__name__}: {err}"
        ops = list(record.get("ops") or [])
        rejected = {**base, "verdict": verdict, "errors": [message], "problem": source}
        return Outcome(pid, ops, verdict, rejected)
    ops = list(record.get("ops") or translation.operators)
    base["ops"] = ops
    try:
        result = verify(source, translation.code)
        verdict = verdict_name(result.verdict)  # files carry names, never enum numbers
    except fatal:
        raise
    except Exception as err:  # noqa: BLE001 - the sandbox failed, not the kernel: retry later
        return Outcome(
            pid, ops, "infrastructure_error", {**base, "errors": [f"{type(err).__name__}: {err}"]}
        )
    if verdict in RETRY_VERDICTS:
        return Outcome(pid, ops, "infrastructure_error", {**base, "errors": [result.message]})
    pair = {
        **base,
        "prompt": build_prompt(source),
        "completion": build_completion(translation.code),
        "verdict": verdict,
        "errors": [result.message] if result.message and verdict != "correct" else [],
        "speedup_vs_eager": result.speedup_vs_eager,
        "speedup_vs_compile": result.speedup_vs_compile,
        "kernel_count": translation.kernel_count,
        "kernels": [list(kernel) for kernel in translation.kernels],
        "problem": source,
    }
    speedup = result.speedup_vs_eager if verdict == "correct" else None
    return Outcome(pid, ops, verdict, pair, speedup)


def _progress(total: int | None, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="program", file=sys.stderr, dynamic_ncols=True)


def _write(handle: TextIO, record: dict[str, Any]) -> None:
    handle.write(json.dumps(record) + "\n")
    handle.flush()


def build_pairs(
    programs: Iterable[dict[str, Any]],
    out: Path,
    verify: Verifier,
    *,
    rejects: Path | None = None,
    jobs: int = 1,
    progress: bool = True,
    total: int | None = None,
    fatal: tuple[type[BaseException], ...] = (),
    on_outcome: Callable[[Outcome], None] | None = None,
) -> BuildSummary:
    """Translate, verify and write pairs (see the module docstring for the files)."""
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    rejects = Path(rejects) if rejects else out.with_name(out.stem + ".rejected.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    if not partial.exists() and out.exists():
        shutil.copyfile(out, partial)  # extend a finished file
    done = _recover(partial) | _recover(rejects)
    summary = BuildSummary()
    failures_in_a_row = 0
    bar = _progress(total, progress)
    with open(partial, "a") as pairs_file, open(rejects, "a") as rejects_file:

        def record(outcome: Outcome) -> None:
            nonlocal failures_in_a_row
            summary.add(outcome)
            if outcome.verdict == "infrastructure_error":
                failures_in_a_row += 1
                if failures_in_a_row >= MAX_CONSECUTIVE_FAILURES:
                    errors = (outcome.record or {}).get("errors") or ["?"]
                    raise SandboxDown(
                        f"the sandbox failed {failures_in_a_row} times in a row: {errors[0]}"
                    )
            else:
                failures_in_a_row = 0
            if outcome.verdict == "correct":
                _write(pairs_file, outcome.record or {})
            elif outcome.verdict != "infrastructure_error" and outcome.record is not None:
                _write(rejects_file, outcome.record)
            if on_outcome:
                on_outcome(outcome)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(correct=summary.correct, refresh=False)

        def pending() -> Iterator[dict[str, Any]]:
            for item in programs:
                pid = program_id(item)
                if pid in done:  # handled by an earlier run (or a duplicate record)
                    summary.skipped += 1
                    if bar is not None:
                        bar.update(1)
                    continue
                done.add(pid)
                yield item

        try:
            if jobs <= 1:
                for item in pending():
                    record(process(item, verify, fatal))
            else:
                with ThreadPoolExecutor(jobs) as pool:
                    running: set[Future[Outcome]] = set()
                    for item in pending():
                        running.add(pool.submit(process, item, verify, fatal))
                        if len(running) >= 2 * jobs:
                            finished, running = wait(running, return_when=FIRST_COMPLETED)
                            for future in finished:
                                record(future.result())
                    for future in running:
                        record(future.result())
        finally:
            if bar is not None:
                bar.close()
            os.fsync(pairs_file.fileno())
            os.fsync(rejects_file.fileno())
    os.replace(partial, out)
    return summary
