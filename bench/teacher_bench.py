"""Teacher benchmark: pass rate and speedups of the teacher's kernels, by operator family.

    python -m bench.teacher_bench --max-seconds 420 --out runs/teacher_bench.md   # GPU host
    python -m bench.teacher_bench --max-seconds 420 --resume                      # and again
    python -m bench.teacher_bench --quick --allow-weak-isolation                   # CPU smoke run
    python -m bench.teacher_bench --report-only runs/teacher_bench/results.jsonl

Programs come from the project's generator: level 1 with exactly `--per-op` programs
for each operator (the generator drawing from that operator alone), level 2 drawn from
every operator. The teacher translates each one (a program it cannot translate is a
failure, with its reason) and the sandbox verifies it and, on a GPU, times it against
eager PyTorch and torch.compile, through `synth.teacher.build`: the same path that
builds the SFT pairs. Programs are interleaved (operators round-robin, level 2 spread
evenly), so a run stopped early by `--max-seconds` still covers every family.

Per-program results go to OUT_DIR/results.jsonl, one flushed line each (the first line
holds the run's settings), so a killed run can still be reported with `--report-only`.
At the paper profile one verification takes tens of seconds, so the full table needs
several runs: `--resume` continues OUT_DIR's run (same settings, checked), skipping the
programs that have a result and retrying infrastructure failures, and appends to the file;
`--retry timeout` (any failure verdicts) judges those programs again too, e.g. with a
longer `--job-timeout` for the few whose eager baseline alone takes seconds a call, and
`--rejudge relu,sigmoid` the programs of operators whose kernels the teacher now writes
differently (`--rejudge pointwise`: a whole family, e.g. after a change to the timing).
Families are the teacher's template families (`synth.teacher.parse.OPERATORS`); a
level-2 program is filed under its main operator's family, and counts as fused when
the teacher emitted fewer kernels than it has operators.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")

# A level-2 program is filed under the first of these families among its operators.
MAIN_FAMILY_ORDER = (
    "conv", "matmul", "pool", "norm", "softmax", "scan", "reduction", "layout", "pointwise",
)  # fmt: skip
QUICK_OPS = ("relu", "add", "sum", "softmax", "layer_norm", "matmul")
MAX_FAILURES_LISTED = 50
MAX_MESSAGE_CHARS = 2000
MAX_LISTED_CHARS = 240
OOM_MARK = "CUDA out of memory"
# Paper-profile tensors reach GiBs: five trials, two checks and timing move tens of GiB,
# and jobs wait their turn for GPU memory.
PAPER_JOB_TIMEOUT_S = 600.0
# Verdicts about the sandbox rather than the kernel (with `OOM_MARK`): retried on --resume.
RETRY_VERDICTS = frozenset({"infrastructure_error", "sandbox_error"})
# Settings that fix the program list and the measurement: a resumed run must match them.
# (--workers and --max-seconds may change between runs.)
RESUME_SETTINGS = (
    "profile", "seed", "per_op", "level2", "ops", "trials", "timing", "timing_runs", "device",
    "gpu",
)  # fmt: skip
# Checked once the programs exist: the same settings must give the same programs.
PROGRAM_SETTINGS = ("planned", "programs_digest")
RESULTS_NAME = "results.jsonl"
PAIRS_NAME = "pairs.jsonl"
# `synth.teacher.build`'s files: in progress, finished, rejected pairs.
PAIRS_FILES = (PAIRS_NAME + ".partial", PAIRS_NAME, "pairs.rejected.jsonl")


@dataclass(frozen=True)
class SpeedTarget:
    """Median speedup vs eager that a group of correct, timed programs must reach."""

    label: str
    level: int
    families: tuple[str, ...] | None  # None: every family
    fused_only: bool
    min_median: float


SPEED_TARGETS = (
    SpeedTarget("elementwise (pointwise family), level 1", 1, ("pointwise",), False, 1.0),
    SpeedTarget("reduction, level 1", 1, ("reduction",), False, 1.0),
    SpeedTarget("normalisation (norm family), level 1", 1, ("norm",), False, 1.0),
    SpeedTarget("fused level-2 programs", 2, None, True, 1.3),
)


# -- per-program results -------------------------------------------------------------------


@dataclass
class Result:
    """One program's outcome, as one line of results.jsonl."""

    program_id: str
    level: int
    ops: list[str]
    families: list[str]
    family: str
    verdict: str
    message: str = ""
    kernel_count: int | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    candidate_ms: float | None = None
    eager_ms: float | None = None
    compile_ms: float | None = None
    candidate_spread: float | None = None
    retimed: bool = False  # the host clock, not the events, gave the candidate's time
    elapsed_s: float | None = None
    stage_seconds: dict[str, float] = field(default_factory=dict)
    gpu_memory_gib: dict[str, float] = field(default_factory=dict)
    problem: str = ""  # kept for failures only, to reproduce them
    label: str = ""  # the run's --label: a rejudge split over several runs resumes

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    @property
    def fused(self) -> bool:
        return self.kernel_count is not None and self.kernel_count < len(self.ops)

    @property
    def retry(self) -> bool:
        """The sandbox failed or the GPU was full: nothing learnt about the kernel."""
        return self.verdict in RETRY_VERDICTS or OOM_MARK in self.message

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Result:
        from sandbox.result import verdict_name

        names = {f.name for f in dataclasses.fields(Result)}
        fields = {k: v for k, v in data.items() if k in names}
        if "verdict" in fields:  # older logs carry the enum's number
            fields["verdict"] = verdict_name(fields["verdict"])
        return Result(**fields)


def family_of(op: str) -> str:
    """The teacher's template family of an operator."""
    from synth.teacher.parse import OPERATORS

    spec = OPERATORS.get(op)
    return spec.family if spec else "unknown"


def main_family(families: Sequence[str]) -> str:
    """The family a program is filed under: its heaviest operator's (`MAIN_FAMILY_ORDER`)."""
    present = set(families)
    return next((f for f in MAIN_FAMILY_ORDER if f in present), families[0] if families else "")


def first_line(text: str, limit: int = MAX_LISTED_CHARS) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def make_result(
    outcome: Any, record: dict[str, Any], verified: Any | None, label: str = ""
) -> Result:
    """A `Result` from `synth.teacher.build`'s outcome and the sandbox's full reply."""
    ops = list(outcome.ops or record.get("ops") or [])
    families = [family_of(op) for op in ops]
    pair = outcome.record or {}
    errors = pair.get("errors") or []
    correct = outcome.verdict == "correct"
    return Result(
        program_id=outcome.program_id,
        level=int(record.get("level") or 0),
        ops=ops,
        families=families,
        family=main_family(families),
        verdict=outcome.verdict,
        message=str(errors[0])[:MAX_MESSAGE_CHARS] if errors else "",
        # Fused groups, not kernels defined: a split normalisation's moments kernel aside.
        kernel_count=len(pair["kernels"]) if pair.get("kernels") else pair.get("kernel_count"),
        speedup_vs_eager=pair.get("speedup_vs_eager"),
        speedup_vs_compile=pair.get("speedup_vs_compile"),
        candidate_ms=getattr(verified, "candidate_ms", None),
        eager_ms=getattr(verified, "eager_ms", None),
        compile_ms=getattr(verified, "compile_ms", None),
        candidate_spread=getattr(verified, "candidate_spread", None),
        retimed=bool(getattr(verified, "retimed", False)),
        elapsed_s=getattr(verified, "elapsed_s", None),
        stage_seconds=dict(getattr(verified, "stage_seconds", None) or {}),
        gpu_memory_gib=dict(getattr(verified, "gpu_memory_gib", None) or {}),
        problem="" if correct else record["source"],
        label=label,
    )


class ResultLog:
    """results.jsonl: a `meta` line, one `result` line per program, an `end` line; flushed."""

    def __init__(self, path: Path, append: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle: TextIO = open(path, "a" if append else "w")  # noqa: SIM115 - see close()

    def write(self, kind: str, data: dict[str, Any]) -> None:
        self.handle.write(json.dumps({"kind": kind, **data}) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.close()


def load_log(path: Path) -> tuple[dict[str, Any], list[Result], dict[str, Any] | None]:
    """(meta, results, end) from results.jsonl; a torn last line (a killed run) is skipped.

    A resumed file holds several runs, each after the first opened by a `resume` line: a
    program retried in a later run counts with its latest result, `end` is the last run's,
    and meta gains `resumes` (those lines) and `earlier_results` (results older than the
    last run), for the report's header.
    """
    meta: dict[str, Any] = {}
    latest: dict[str, Result] = {}
    earlier: set[str] = set()
    resumes: list[dict[str, Any]] = []
    end: dict[str, Any] | None = None
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(data, dict):
            continue
        kind = data.pop("kind", "result")
        if kind == "meta":
            meta = data
        elif kind == "resume":
            resumes.append(data)
            earlier = set(latest)
            end = None  # the earlier run's end says nothing about this one
        elif kind == "end":
            end = data
        elif kind == "result":
            result = Result.from_dict(data)
            latest[result.program_id] = result
            earlier.discard(result.program_id)
    if resumes:
        meta = {**meta, "resumes": resumes, "earlier_results": len(earlier)}
    return meta, list(latest.values()), end


def done_ids(
    results: Iterable[Result],
    again: frozenset[str] = frozenset(),
    rejudge: frozenset[str] = frozenset(),
    label: str | None = None,
) -> set[str]:
    """Programs a resumed run skips: those with a result that says something about the kernel,
    unless its verdict is one of `again` (`--retry`: a timeout, say, with a longer budget) or
    all its operators are in `rejudge` (`--rejudge`: the teacher changed how it writes them)
    and a run labelled otherwise than `label` judged it (a rejudge cut short goes on)."""

    def again_now(r: Result) -> bool:
        return bool(rejudge) and set(r.ops) <= rejudge and (not label or r.label != label)

    return {
        r.program_id for r in results if not r.retry and r.verdict not in again and not again_now(r)
    }


def _shown(value: Any, limit: int = 120) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def setting_mismatches(
    earlier: dict[str, Any], current: dict[str, Any], names: Sequence[str]
) -> list[str]:
    """One line per setting of `names` that differs between an earlier run and this one.

    Values are compared as JSON (results.jsonl turns `planned`'s keys into strings); a
    setting the earlier run did not record differs, except `programs_digest` (older files).
    """
    lines = []
    for name in names:
        if name == "programs_digest" and name not in earlier:
            continue
        new = json.loads(json.dumps(current.get(name)))
        if name not in earlier:
            lines.append(f"{name}: not recorded by the earlier run, this run {_shown(new)}")
        elif earlier[name] != new and name == "programs_digest":
            lines.append(f"{name}: the same settings generate other programs (generator changed?)")
        elif earlier[name] != new:
            lines.append(f"{name}: earlier run {_shown(earlier[name])}, this run {_shown(new)}")
    return lines


# -- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1), interpolating linearly between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    count: int
    median: float
    p10: float
    p90: float


def spread(values: Iterable[float | None]) -> Spread | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return None
    return Spread(len(xs), statistics.median(xs), percentile(xs, 0.1), percentile(xs, 0.9))


def group_by(results: Iterable[Result], key: Callable[[Result], str]) -> dict[str, list[Result]]:
    groups: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        groups[key(result)].append(result)
    return dict(sorted(groups.items()))


def speedups(results: Iterable[Result], attr: str) -> list[float]:
    """Speedups of the correct programs (a wrong kernel's time means nothing)."""
    return [v for r in results if r.correct and (v := getattr(r, attr)) is not None]


# -- the report ------------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "n/a"


def pass_table(results: Sequence[Result]) -> list[str]:
    """Pass rate per level (total row first) and per family."""
    lines = [
        "| level | family | programs | correct | pass rate | other verdicts |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for level, rows in group_by(results, lambda r: str(r.level)).items():
        groups = {"all": rows, **group_by(rows, lambda r: r.family)}
        for family, members in groups.items():
            correct = sum(r.correct for r in members)
            others = Counter(r.verdict for r in members if not r.correct)
            verdicts = ", ".join(f"{v} {n}" for v, n in others.most_common()) or "-"
            name = "**all**" if family == "all" else family
            lines.append(
                f"| {level} | {name} | {len(members)} | {correct} "
                f"| {_pct(correct, len(members))} | {verdicts} |"
            )
    return lines


def speed_table(groups: dict[str, list[Result]], timing: bool) -> list[str]:
    """Median, p10 and p90 of the speedups vs eager and vs torch.compile, per group."""
    lines = [
        "| group | programs | correct | timed | eager median | eager p10 | eager p90 "
        "| compile median | compile p10 | compile p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, members in groups.items():
        eager = spread(speedups(members, "speedup_vs_eager"))
        comp = spread(speedups(members, "speedup_vs_compile"))
        cells = [name, str(len(members)), str(sum(r.correct for r in members))]
        cells.append(str(eager.count) if eager else "0")
        for s in (eager, comp):
            if s:
                cells += [_x(s.median), _x(s.p10), _x(s.p90)]
            else:
                cells += ["-" if timing else "n/a"] * 3
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def level2_groups(results: Sequence[Result]) -> dict[str, list[Result]]:
    level2 = [r for r in results if r.level == 2]
    groups = {
        "all": level2,
        "fused (fewer kernels than operators)": [r for r in level2 if r.fused],
        "not fused": [r for r in level2 if not r.fused],
    }
    for family, members in group_by(level2, lambda r: r.family).items():
        groups[f"main operator: {family}"] = members
    return groups


def operator_table(results: Sequence[Result], timing: bool) -> list[str]:
    """Level 1, one row per operator: the detail behind the family rows."""
    lines = [
        "| operator | family | programs | correct | eager median | compile median |",
        "|---|---|---:|---:|---:|---:|",
    ]
    level1 = [r for r in results if r.level == 1 and r.ops]
    for op, members in group_by(level1, lambda r: r.ops[0]).items():
        medians = [spread(speedups(members, a)) for a in ("speedup_vs_eager", "speedup_vs_compile")]
        cells = [_x(s.median) if s else ("-" if timing else "n/a") for s in medians]
        lines.append(
            f"| {op} | {members[0].family} | {len(members)} | {sum(r.correct for r in members)} "
            f"| {cells[0]} | {cells[1]} |"
        )
    return lines


def _matches(result: Result, target: SpeedTarget) -> bool:
    return (
        result.level == target.level
        and (target.families is None or result.family in target.families)
        and (result.fused or not target.fused_only)
    )


def target_lines(results: Sequence[Result], timing: bool, planned: dict[int, int]) -> list[str]:
    """One PASS / MISS / n/a line per target of the issue."""
    lines = []
    for level in sorted(planned):
        members = [r for r in results if r.level == level]
        # Ill-posed problems (a reference with Inf, say) and the sandbox's own failures
        # say nothing about the kernel: the rate is over the programs judged.
        judged = [r for r in members if not r.retry and r.verdict != "bad_problem"]
        retried = sum(r.retry for r in members)
        ill_posed = len(members) - len(judged) - retried
        correct = sum(r.correct for r in judged)
        ok = bool(judged) and correct == len(judged) and not retried
        missing = planned[level] - len(members)
        notes = [
            f"{n} {what}"
            for n, what in (
                (missing, "not run"),
                (retried, "not judged: sandbox or GPU memory failures, retried on --resume"),
                (ill_posed, "not judged: ill-posed problems (`bad_problem`)"),
            )
            if n > 0
        ]
        lines.append(
            f"- {'PASS' if ok else 'MISS'}: level {level} pass rate 100% "
            f"(measured {_pct(correct, len(judged))}, {correct}/{len(judged)} judged"
            + "".join(f"; {note}" for note in notes)
            + ")"
        )
    for target in SPEED_TARGETS:
        goal = f"median speedup vs eager >= {target.min_median:.1f}x on {target.label}"
        found = spread(speedups([r for r in results if _matches(r, target)], "speedup_vs_eager"))
        if not timing:
            lines.append(f"- n/a: {goal} (no timing on this device)")
        elif found is None:
            lines.append(f"- n/a: {goal} (no correct, timed programs)")
        else:
            verdict = "PASS" if found.median >= target.min_median else "MISS"
            lines.append(f"- {verdict}: {goal} (measured {_x(found.median)}, n={found.count})")
    return lines


def failure_lines(results: Sequence[Result], cap: int = MAX_FAILURES_LISTED) -> list[str]:
    failures = [r for r in results if not r.correct]
    lines = [
        f"- `{r.program_id}` L{r.level} {'+'.join(r.ops)}: {r.verdict}: {first_line(r.message)}"
        for r in failures[:cap]
    ]
    if len(failures) > cap:
        lines.append(f"- ... and {len(failures) - cap} more (see {RESULTS_NAME})")
    return lines or ["none"]


def _distribution_table(
    label: str,
    groups: dict[str, list[float]],
    digits: int,
    last: tuple[str, Callable[[list[float]], float], int],
) -> list[str]:
    """One row per group: its size, median and p90, and one more column (`last`)."""
    name, summary, last_digits = last
    lines = [f"| {label} | jobs | median | p90 | {name} |", "|---|---:|---:|---:|---:|"]
    for group, values in groups.items():
        lines.append(
            f"| {group} | {len(values)} | {statistics.median(values):.{digits}f} "
            f"| {percentile(values, 0.9):.{digits}f} | {summary(values):.{last_digits}f} |"
        )
    return lines


def stage_lines(results: Sequence[Result]) -> list[str]:
    """Median / p90 seconds per sandbox stage: where a verification's time goes."""
    stages: dict[str, list[float]] = defaultdict(list)
    for result in results:
        for name, seconds in result.stage_seconds.items():
            stages[name].append(seconds)
    if not stages:
        return []
    return _distribution_table("stage (seconds)", stages, 3, ("total", sum, 0))


def memory_lines(results: Sequence[Result]) -> list[str]:
    """How each job's GPU memory compared with its I/O and its reservation (GPU runs)."""
    ratios: dict[str, list[float]] = defaultdict(list)
    for result in results:
        memory = result.gpu_memory_gib
        io, reserved = memory.get("io") or 0.0, memory.get("reserved") or 0.0
        grader, candidate = memory.get("grader_peak"), memory.get("candidate_peak")
        if io > 0 and grader is not None:
            ratios["grader peak / I/O"].append(grader / io)
        if io > 0 and candidate is not None:
            ratios["candidate peak / I/O"].append(candidate / io)
        if reserved > 0 and grader is not None and candidate is not None:
            ratios["both peaks / reserved"].append((grader + candidate) / reserved)
    if not ratios:
        return []
    return _distribution_table("ratio", ratios, 2, ("max", max, 2))


def _header(meta: dict[str, Any], results: Sequence[Result], end: dict[str, Any] | None) -> str:
    planned = sum(meta.get("planned", {}).values()) or len(results)
    ops = meta.get("ops") or []
    resumes = meta.get("resumes") or []
    earlier = int(meta.get("earlier_results") or 0)
    workers = dict.fromkeys(str(run.get("workers", "?")) for run in [meta, *resumes])
    lines = [
        f"Programs: profile `{meta.get('profile', '?')}`, seed {meta.get('seed', '?')}; "
        f"level 1: {meta.get('per_op', '?')} per operator over {len(ops)} operators; "
        f"level 2: {meta.get('level2', '?')}.",
        f"Sandbox: device `{meta.get('device', '?')}`"
        + (f" ({meta['gpu']})" if meta.get("gpu") else "")
        + f", {', '.join(workers)} workers, {meta.get('trials', '?')} trials, "
        + (
            f"timing {meta.get('timing_runs', '?')} runs vs eager and torch.compile."
            if meta.get("timing")
            else "no timing."
        ),
    ]
    labels = [str(run["label"]) for run in [meta, *resumes] if run.get("label")]
    if labels:
        lines.append("Runs: " + ", ".join(f"`{label}`" for label in labels) + ".")
    if resumes:
        lines.append(
            f"Resumed {len(resumes)} time(s): {earlier} of these {len(results)} results come "
            "from earlier runs (a resumed run retries infrastructure failures)."
        )
    if end is None:
        lines.append(
            f"The run did not finish (no end record): {len(results)} of {planned} programs "
            "have results" + (f" ({earlier} from earlier runs)." if resumes else ".")
        )
    else:
        elapsed = float(end.get("elapsed_s") or 0.0)
        new = len(results) - earlier
        if resumes:
            rate = f", {new / elapsed:.2f} per second" if elapsed and new else ""
            took = f" ({earlier} from earlier runs; this run {new} in {elapsed:.0f} s{rate})"
        else:
            rate = f" ({new / elapsed:.2f} per second)" if elapsed else ""
            took = f" in {elapsed:.0f} s{rate}"
        lines.append(
            f"Finished {len(results)} of {planned} programs{took}"
            + (f"; {planned - len(results)} not run" if planned > len(results) else "")
            + (f" ({end['stopped']})" if end.get("stopped") else "")
            + "."
        )
    lines += [f"Note: {note}" for note in meta.get("notes", [])]
    oom = sum(OOM_MARK in r.message for r in results)
    if oom:
        lines.append(
            f"Note: {oom} failures are CUDA out-of-memory errors (the sandbox's workers share one "
            "GPU): a capacity problem rather than the teacher's; rerun with fewer --workers "
            "and --resume to retry them."
        )
    return "\n".join(lines)


def render_report(
    meta: dict[str, Any], results: Sequence[Result], end: dict[str, Any] | None
) -> str:
    """The markdown report of a run (also what `--report-only` prints)."""
    timing = bool(meta.get("timing"))
    planned = {int(k): int(v) for k, v in meta.get("planned", {}).items()}
    planned = planned or dict(Counter(r.level for r in results))
    level1 = [r for r in results if r.level == 1]
    md = ["# Teacher benchmark", "", _header(meta, results, end), ""]
    md += ["## Targets", "", *target_lines(results, timing, planned), ""]
    md += ["## Pass rate", "", *pass_table(results), ""]
    md += ["## Level 1: speedup by family (correct programs)", ""]
    md += [*speed_table(group_by(level1, lambda r: r.family), timing), ""]
    md += ["## Level 2: speedup", "", *speed_table(level2_groups(results), timing), ""]
    md += ["## Level 1 by operator", "", *operator_table(results, timing), ""]
    stages = stage_lines(results)
    if stages:
        md += ["## Sandbox stages (seconds per verification)", "", *stages, ""]
    memory = memory_lines(results)
    if memory:
        md += ["## GPU memory per job (peaks against the job's I/O and reservation)", ""]
        md += [*memory, ""]
    failures = sum(not r.correct for r in results)
    md += [f"## Failures ({failures}, first {MAX_FAILURES_LISTED} listed)", ""]
    md += failure_lines(results)
    return "\n".join(md) + "\n"


# -- programs --------------------------------------------------------------------------------


def interleave(first: Sequence[T], second: Sequence[T]) -> list[T]:
    """Both sequences in their own order, the second spread evenly through the first."""
    keyed = [((i + 0.5) / len(first), 0, i) for i in range(len(first))]
    keyed += [((j + 0.5) / len(second), 1, j) for j in range(len(second))]
    return [(first, second)[which][i] for _, which, i in sorted(keyed)]


def generate(
    ops: Sequence[str], per_op: int, level2: int, seed: int, profile: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """Program records (level 1 round-robin over `ops`, level 2 spread through), and notes."""
    from synth.generate import Unsatisfiable, generate_programs

    notes: list[str] = []
    columns = []
    for op in ops:
        try:
            columns.append(list(generate_programs(1, per_op, seed, profile, [op])))
        except Unsatisfiable as err:
            notes.append(f"generator: no level-1 program for {op}: {err}")
    level1 = [column[i] for i in range(per_op) for column in columns if i < len(column)]
    second = list(generate_programs(2, level2, seed, profile, ops)) if level2 else []
    records = [json.loads(r.to_json()) for r in interleave(level1, second)]
    return records, notes


# -- running ---------------------------------------------------------------------------------


class NotStarted(Exception):
    """A verification still queued when the run began stopping: left out, counted as not run."""


class Feed:
    """Hands programs to the build loop until the time budget is spent or a stop is asked."""

    def __init__(self, programs: Sequence[dict[str, Any]], deadline: float | None) -> None:
        self.programs = programs
        self.deadline = deadline
        self.stopped = ""

    def stop(self, reason: str) -> None:
        self.stopped = self.stopped or reason

    def stopping(self) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.stop("past --max-seconds")
        return bool(self.stopped)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for program in self.programs:
            if self.stopping():
                return
            yield program


def _on_sigterm(feed: Feed) -> None:
    """First SIGTERM: submit nothing more, finish what runs, report. Second: stop now."""

    received = 0

    def handler(signum: int, frame: Any) -> None:
        nonlocal received
        received += 1
        if received > 1:
            raise KeyboardInterrupt
        feed.stop("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def verify_all(
    programs: Sequence[dict[str, Any]],
    feed: Feed,
    args: argparse.Namespace,
    device: str,
    log: ResultLog,
) -> None:
    """Translate and verify through `synth.teacher.build`, logging each result as it lands."""
    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig
    from sandbox.errors import InvalidRequestError, WeakIsolationError
    from synth.teacher.build import SandboxDown, build_pairs, program_id

    overrides: dict[str, Any] = {"timing_runs": args.timing_runs} if args.timing_runs else {}
    if args.job_timeout:
        overrides["job_timeout_s"] = args.job_timeout
    config = SandboxConfig(
        workers=args.workers,
        device=device,
        allow_weak_isolation=args.allow_weak_isolation,
        queue_capacity=max(256, 4 * args.workers),
        **overrides,
    )
    by_id = {program_id(p): p for p in programs}
    replies: dict[str, Any] = {}  # problem source -> the sandbox's full reply
    with LocalSandbox(config) as sandbox:

        def verify(problem: str, candidate: str) -> Any:
            if feed.stopping():  # `build_pairs` submits ahead: drop what has not started
                raise NotStarted
            reply = sandbox.verify(problem, candidate, trials=args.trials, timing=args.timing)
            replies[problem] = reply
            return reply

        def record(outcome: Any) -> None:
            errors = (outcome.record or {}).get("errors") or [""]
            if outcome.verdict == "infrastructure_error" and errors[0].startswith("NotStarted"):
                return
            program = by_id[outcome.program_id]
            reply = replies.pop(program["source"], None)
            log.write(
                "result", dataclasses.asdict(make_result(outcome, program, reply, args.label or ""))
            )

        out = args.out_dir / PAIRS_NAME
        try:
            build_pairs(
                feed,
                out,
                verify,
                jobs=args.workers,
                progress=not args.no_progress,
                total=len(programs),
                fatal=(WeakIsolationError, InvalidRequestError),
                on_outcome=record,
            )
        except SandboxDown as err:
            feed.stop(str(err))
        except KeyboardInterrupt:
            feed.stop("interrupted")


def _clear_outputs(out_dir: Path) -> None:
    """A fresh run: `build_pairs` would otherwise resume from an earlier run's files."""
    for name in (RESULTS_NAME, *PAIRS_FILES):
        (out_dir / name).unlink(missing_ok=True)


def _cut_torn_tail(path: Path) -> None:
    """Drop a killed run's unfinished last line, so the next line appended starts clean."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def _line_id(line: bytes) -> str | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return str(data.get("program_id")) if isinstance(data, dict) else None


def _prune_pairs(out_dir: Path, keep: set[str]) -> None:
    """Keep only the lines of `keep`'s programs in `build_pairs`'s files.

    `build_pairs` skips every program they list, so a program to retry (a GPU out of
    memory is a rejected pair there) or one whose run was killed before its result line
    was written must leave them, or it would never get a result.
    """
    for name in PAIRS_FILES:
        path = out_dir / name
        if not path.exists():
            continue
        lines = path.read_bytes().splitlines(keepends=True)
        kept = [line for line in lines if line.endswith(b"\n") and _line_id(line) in keep]
        if len(kept) != len(lines):
            pruned = path.with_name(path.name + ".prune")
            pruned.write_bytes(b"".join(kept))
            os.replace(pruned, path)


def _finish_pairs(out_dir: Path) -> None:
    """Nothing left to verify: still move a killed run's `pairs.jsonl.partial` into place."""
    from synth.teacher.build import build_pairs

    def unused(problem: str, candidate: str) -> Any:
        raise AssertionError("no program left to verify")

    if (out_dir / PAIRS_FILES[0]).exists():
        build_pairs((), out_dir / PAIRS_NAME, unused, progress=False)


def programs_digest(programs: Sequence[dict[str, Any]]) -> str:
    """A hash of the program list: the same settings must give the same programs to resume."""
    from synth.teacher.build import program_id

    digest = hashlib.sha256()
    for program in programs:
        digest.update(f"{program_id(program)}\0{program['source']}\0".encode())
    return digest.hexdigest()[:16]


def _gpu_name(device: str) -> str:
    if device != "cuda":
        return ""
    import torch

    return torch.cuda.get_device_name(0)


def _meta(args: argparse.Namespace, device: str, ops: Sequence[str]) -> dict[str, Any]:
    """The run's settings: the first line of results.jsonl, and the report's header."""
    from sandbox.config import SandboxConfig

    names = (
        "profile", "seed", "per_op", "level2", "workers", "trials", "timing", "max_seconds",
        "label",
    )  # fmt: skip
    return {
        **{name: getattr(args, name) for name in names},
        "timing_runs": args.timing_runs or SandboxConfig().timing_runs,
        "device": device,
        "gpu": _gpu_name(device),
        "ops": list(ops),
    }


def _earlier_run(path: Path, resume: bool) -> tuple[dict[str, Any], list[Result]] | str | None:
    """The run to resume, as (meta, results); None for a fresh run; an error's text."""
    if not resume or not path.exists():
        return None
    meta, results, _ = load_log(path)
    if not meta and not results:
        return None  # killed before its first line: nothing to keep
    if not meta:
        return f"cannot resume {path}: it has no settings line (run without --resume)"
    return meta, results


def _refusal(path: Path, differences: Sequence[str]) -> str:
    return (
        f"cannot resume {path}: settings differ from the earlier run's "
        "(run with the same settings, or without --resume to start over):\n  "
        + "\n  ".join(differences)
    )


EarlierRun = tuple[dict[str, Any], list[Result]]


def _check_settings(
    args: argparse.Namespace, console: Console
) -> tuple[Sequence[str], str, dict[str, Any], EarlierRun | None] | int:
    """This run's operators, device and settings, and the earlier run to resume (or an exit
    status): checked before generating, as the paper profile takes a while."""
    from sandbox.config import resolve_device
    from synth.generate import resolve_ops

    try:
        ops = resolve_ops(args.ops.split(",") if args.ops else None)
    except KeyError as err:
        console.print(f"error: {err.args[0]}", markup=False)
        return 2
    device = resolve_device(args.device)
    args.timing = device == "cuda" and not args.no_timing
    path = args.out_dir / RESULTS_NAME
    earlier = _earlier_run(path, args.resume)
    if isinstance(earlier, str):
        console.print(f"error: {earlier}", markup=False, soft_wrap=True)
        return 2
    settings = _meta(args, device, ops)
    if earlier and (differences := setting_mismatches(earlier[0], settings, RESUME_SETTINGS)):
        console.print(f"error: {_refusal(path, differences)}", markup=False, soft_wrap=True)
        return 2
    return ops, device, settings, earlier


def _resume_summary(
    args: argparse.Namespace, programs: int, pending: int, earlier: list[Result], done: set[str]
) -> str:
    """The line that says what a resumed run will judge (again), and why."""
    retrying = sum(r.retry for r in earlier)
    again = sum(r.verdict in args.retry and not r.retry for r in earlier)
    asked = f", {again} with verdicts {', '.join(sorted(args.retry))} again" if again else ""
    if args.rejudge:
        ours = sum(
            set(r.ops) <= args.rejudge and not r.retry and r.program_id not in done for r in earlier
        )
        asked += f", {ours} made only of --rejudge operators again"
    return (
        f"resuming {args.out_dir / RESULTS_NAME}: {programs - pending} of {programs} programs "
        f"done in earlier runs, {pending} left ({retrying} infrastructure failures to retry"
        f"{asked})"
    )


def _resume_log(
    args: argparse.Namespace,
    console: Console,
    programs: list[dict[str, Any]],
    meta: dict[str, Any],
    earlier: EarlierRun,
) -> tuple[list[dict[str, Any]], ResultLog] | int:
    """The programs left to judge and the log appended to, once the same settings are seen
    to give the same programs (else exit status 2)."""
    from synth.teacher.build import program_id

    path = args.out_dir / RESULTS_NAME
    if differences := setting_mismatches(earlier[0], meta, PROGRAM_SETTINGS):
        console.print(f"error: {_refusal(path, differences)}", markup=False, soft_wrap=True)
        return 2
    done = done_ids(earlier[1], args.retry, args.rejudge, args.label)
    pending = [p for p in programs if program_id(p) not in done]
    console.print(
        _resume_summary(args, len(programs), len(pending), earlier[1], done), soft_wrap=True
    )
    _prune_pairs(args.out_dir, done)
    _cut_torn_tail(path)
    log = ResultLog(path, append=True)
    log.write(
        "resume", {"workers": args.workers, "max_seconds": args.max_seconds, "label": args.label}
    )
    return pending, log


def _open_log(
    args: argparse.Namespace,
    console: Console,
    programs: list[dict[str, Any]],
    notes: list[str],
    meta: dict[str, Any],
    earlier: EarlierRun | None,
) -> tuple[list[dict[str, Any]], ResultLog] | int:
    """The programs to judge and the results log to write them to: the earlier run's, or
    a fresh one with every earlier output cleared (or an exit status)."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if earlier:
        return _resume_log(args, console, programs, meta, earlier)
    console.print(f"{len(programs)} programs")
    _clear_outputs(args.out_dir)
    log = ResultLog(args.out_dir / RESULTS_NAME)
    log.write("meta", {**meta, "notes": notes})
    return programs, log


def _verify_pending(
    args: argparse.Namespace,
    console: Console,
    pending: list[dict[str, Any]],
    device: str,
    log: ResultLog,
    began: float,
) -> dict[str, Any] | int:
    """Judge `pending` until done, --max-seconds or SIGTERM, and close the log with its end
    record (returned), or an exit status when the sandbox refuses weak isolation."""
    from sandbox.errors import WeakIsolationError

    if pending:
        console.print(f"starting {args.workers} sandbox workers ({device})")
    feed = Feed(pending, began + args.max_seconds if args.max_seconds else None)
    _on_sigterm(feed)
    try:
        if pending:
            verify_all(pending, feed, args, device, log)
        else:
            _finish_pairs(args.out_dir)
        end = {"elapsed_s": time.monotonic() - began, "stopped": feed.stopped}
        log.write("end", end)
    except WeakIsolationError as err:
        console.print(f"error: {err}", markup=False)
        return 2
    finally:
        log.close()
    return end


def run(args: argparse.Namespace) -> tuple[dict[str, Any], list[Result], dict[str, Any]] | int:
    """Generate, translate, verify; returns what the report needs (or an exit status)."""
    from rich.console import Console

    began = time.monotonic()
    console = Console(stderr=True)
    checked = _check_settings(args, console)
    if isinstance(checked, int):
        return checked
    ops, device, settings, earlier = checked
    with console.status(f"generating programs (profile {args.profile})"):
        programs, notes = generate(ops, args.per_op, args.level2, args.seed, args.profile)
    planned = dict(Counter(int(p["level"]) for p in programs))
    meta = {**settings, "planned": planned, "programs_digest": programs_digest(programs)}
    opened = _open_log(args, console, programs, notes, meta, earlier)
    if isinstance(opened, int):
        return opened
    pending, log = opened
    end = _verify_pending(args, console, pending, device, log, began)
    if isinstance(end, int):
        return end
    meta, results, _ = load_log(args.out_dir / RESULTS_NAME)
    return meta, results, end


# -- command line ----------------------------------------------------------------------------


def _git_commit() -> str:
    """The checkout's commit (with `+` when it has changes), or '' outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        command = ["git", "-C", str(root), *args]
        run = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
        return run.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit + ("+" if dirty else "")


def rejudge_operators(names: frozenset[str]) -> frozenset[str]:
    """`--rejudge`'s operators: names as given, families expanded to their operators."""
    from synth.operators import OPERATOR_NAMES
    from synth.teacher.parse import OPERATORS

    by_family: dict[str, set[str]] = {}
    for name in OPERATOR_NAMES:
        by_family.setdefault(OPERATORS[name].family, set()).add(name)
    if unknown := sorted(names - set(OPERATOR_NAMES) - set(by_family)):
        raise ValueError(
            f"--rejudge takes operator or family names ({', '.join(sorted(by_family))}); "
            f"not {', '.join(unknown)}"
        )
    return frozenset().union(*(by_family.get(name, {name}) for name in names))


def _add_program_args(parser: argparse.ArgumentParser) -> None:
    """Which programs the generator makes (--quick: a small CPU preset of them)."""
    parser.add_argument("--quick", action="store_true", help="small CPU smoke run (tiny profile)")
    parser.add_argument("--profile", help="generator profile (default paper; --quick: tiny)")
    parser.add_argument("--per-op", type=int, help="level-1 programs per operator (default 10)")
    parser.add_argument("--level2", type=int, help="level-2 programs (default 200)")
    parser.add_argument("--ops", help="comma-separated operators (both levels; default all)")
    parser.add_argument("--seed", type=int, default=0)


def _add_sandbox_args(parser: argparse.ArgumentParser) -> None:
    """How the sandbox judges and times each program, and for how long the run goes on."""
    parser.add_argument(
        "--workers",
        type=int,
        help="sandbox grader workers (default 8; they share one GPU through the sandbox's "
        "memory budget, so large jobs wait for room; --quick: 2)",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials per program")
    parser.add_argument("--timing-runs", type=int, help="timed runs per kernel (sandbox default)")
    parser.add_argument(
        "--job-timeout",
        type=float,
        help="seconds one verification may take, waits for GPU memory included (default 600 "
        "for the paper profile, whose tensors reach GiBs; else the sandbox's default)",
    )
    parser.add_argument("--no-timing", action="store_true", help="correctness only")
    parser.add_argument("--allow-weak-isolation", action="store_true")
    parser.add_argument(
        "--max-seconds", type=float, help="submit no new program after this long (this run's)"
    )


def _add_output_args(parser: argparse.ArgumentParser) -> None:
    """Where the results log, the pairs and the report go."""
    parser.add_argument("--out-dir", type=Path, default=Path("runs/teacher_bench"))
    parser.add_argument("--out", type=Path, help="markdown report (default OUT_DIR/report.md)")


def _add_resume_args(parser: argparse.ArgumentParser) -> None:
    """Continuing an earlier run, and what it judges again."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue OUT_DIR's run: keep its results.jsonl and pairs files, skip every program "
        "that has a result, append the new ones; the report covers all of them. Programs that "
        "ended in an infrastructure failure (sandbox_error, infrastructure_error, CUDA out of "
        "memory) are retried, not skipped. The settings that fix the programs and the "
        "measurement (profile, seed, --per-op, --level2, --ops, --trials, timing, --timing-runs, "
        "device and GPU) must match the earlier run's, else exit status 2; --workers and "
        "--max-seconds may change. Without results.jsonl: a fresh run",
    )
    parser.add_argument(
        "--retry",
        default="",
        help="with --resume: comma list of verdicts to judge again as well (e.g. timeout, with "
        "a longer --job-timeout); the new result replaces the old one in the report",
    )
    parser.add_argument(
        "--rejudge",
        default="",
        metavar="OPS",
        help="with --resume: comma list of operators (or families: pointwise, reduction, ...) "
        "whose programs (those made only of them) are judged again, after a change to how the "
        "teacher writes them or to the sandbox's timing; the new result replaces the old one "
        "in the report. Programs a run with this --label already judged are not judged again: "
        "a rejudge cut short by --max-seconds goes on where it stopped",
    )


def _add_report_args(parser: argparse.ArgumentParser) -> None:
    """Progress, the run's label, and rebuilding a report without running anything."""
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--label",
        help="a note kept with this run's settings (default: the git commit, when there is one)",
    )
    parser.add_argument(
        "--report-only", type=Path, metavar="JSONL", help="rebuild the report from results.jsonl"
    )


def _fill_defaults(args: argparse.Namespace) -> None:
    """Defaults that depend on other flags: --quick's small CPU preset, the paper profile's
    longer job timeout, the git commit as label; --retry and --rejudge as sets."""
    if args.label is None:
        args.label = _git_commit()
    quick = args.quick
    args.profile = args.profile or ("tiny" if quick else "paper")
    args.per_op = args.per_op if args.per_op is not None else (1 if quick else 10)
    args.level2 = args.level2 if args.level2 is not None else (3 if quick else 200)
    args.ops = args.ops or (",".join(QUICK_OPS) if quick else None)
    args.workers = args.workers or (2 if quick else 8)
    args.retry = frozenset(v.strip() for v in args.retry.split(",") if v.strip())
    args.rejudge = frozenset(v.strip() for v in args.rejudge.split(",") if v.strip())
    if args.job_timeout is None and args.profile == "paper":
        args.job_timeout = PAPER_JOB_TIMEOUT_S


def _check_resume_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--retry and --rejudge need --resume and known names; --rejudge's families become
    their operators."""
    for flag, chosen in (("--retry", args.retry), ("--rejudge", args.rejudge)):
        if chosen and not args.resume:
            parser.error(f"{flag} needs --resume (a fresh run judges every program anyway)")
    try:
        args.rejudge = rejudge_operators(args.rejudge)
    except ValueError as error:
        parser.error(str(error))
    failures = _failure_verdicts()
    if unknown := sorted(args.retry - failures):
        parser.error(
            f"--retry takes failure verdicts ({', '.join(sorted(failures))}); "
            f"not {', '.join(unknown)}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, defaults filled and checked (a usage error exits with status 2)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.teacher_bench", description=__doc__.split("\n\n")[0]
    )
    _add_program_args(parser)
    _add_sandbox_args(parser)
    _add_output_args(parser)
    _add_resume_args(parser)
    _add_report_args(parser)
    args = parser.parse_args(argv)
    _fill_defaults(args)
    _check_resume_args(parser, args)
    if args.job_timeout is not None and not args.job_timeout > 0:
        parser.error("--job-timeout must be > 0")
    if args.per_op < 0 or args.level2 < 0 or args.workers < 1 or args.trials < 1:
        parser.error("counts must be >= 0, --workers and --trials >= 1")
    return args


def _failure_verdicts() -> frozenset[str]:
    """The verdicts a result can carry other than correct (the sandbox's, and ours for a
    sandbox that could not be reached)."""
    from sandbox.result import VERDICTS

    return frozenset(VERDICTS) - {"correct"} | {"infrastructure_error"}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    status = 0
    if args.report_only:
        meta, results, end = load_log(args.report_only)
    else:
        try:
            outcome = run(args)
        except KeyboardInterrupt:
            # Stopped by hand or by a wall-clock limit: report what landed (--resume goes on).
            path = args.out_dir / RESULTS_NAME
            if not path.exists():
                return 130
            print("interrupted: the report covers the programs that finished", file=sys.stderr)
            outcome, status = load_log(path), 130
        if isinstance(outcome, int):
            return outcome
        meta, results, end = outcome
    report = render_report(meta, results, end)
    out = args.out or (args.report_only or args.out_dir / RESULTS_NAME).with_name("report.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(report)
    print(f"wrote {out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
