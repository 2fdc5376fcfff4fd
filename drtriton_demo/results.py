"""The demo's closing report: what each stage produced, as one Markdown page and a PNG.

`collect` reads what the stages wrote (evaluation summaries, search outcomes, training
metrics, pair files); `markdown` turns that into the page printed at the end and saved as
OUT/REPORT.md (a pure function); `write_curve` draws both policies' speedup curves in one
figure (the fraction of problems faster than x, as `drtriton eval` computes it).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drtriton_demo.sizes import DemoSize
from drtriton_demo.stages import TEACHER, TRAINED, DemoPaths, search_outcome, search_problems

POLICIES = (TEACHER, TRAINED)
NOT_TIMED = "n/a (not timed)"


@dataclass
class StageTime:
    name: str
    title: str
    seconds: float
    how: str  # "ran", "resumed" or "reused"


@dataclass
class SearchRow:
    problem: str
    ops: list[str]
    policy: str
    outcome: dict[str, Any] | None  # `drtriton search --out` JSON; None when missing


@dataclass
class DemoResults:
    size: DemoSize
    device: str
    paths: DemoPaths
    stages: list[StageTime] = field(default_factory=list)
    pairs: int = 0
    evals: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    searches: list[SearchRow] = field(default_factory=list)
    sft: dict[str, Any] = field(default_factory=dict)
    rl: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Reading what the stages wrote
# --------------------------------------------------------------------------------------------


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def sft_figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The last value of each figure worth a line, from an SFT run's metrics records."""
    figures: dict[str, Any] = {}
    for record in records:
        for key, value in record.items():
            name = key.rsplit("/", 1)[-1]
            if value is not None and name in ("loss", "heldout_loss", "pass_at_1"):
                figures[key] = value
        if "train/loss" in record:
            figures["steps"] = record.get("step", 0)
    return figures


def rl_figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Totals over an RL run's steps: samples, correct ones, sent to the sandbox, unusable."""
    keys = ("n_samples", "n_correct", "n_sent", "n_unparsable", "n_truncated")
    totals: dict[str, Any] = {key: 0 for key in keys}
    steps = 0
    for record in records:
        if "rl/n_samples" not in record:
            continue
        steps = max(steps, int(record.get("step", 0)))
        for key in keys:
            totals[key] += int(record.get(f"rl/{key}") or 0)
    totals["steps"] = steps
    return totals


def _problem_ops(paths: DemoPaths, problem: Path) -> list[str]:
    """The operators of a search problem, from the generator's record it was written from."""
    level, index = problem.stem[1:].split("-")
    records = _jsonl(paths.search_programs(int(level)))
    return list(records[int(index)].get("ops", [])) if int(index) < len(records) else []


def collect(size: DemoSize, device: str, paths: DemoPaths, stages: list[StageTime]) -> DemoResults:
    """Everything the report shows, read from OUT (a stage that did not run shows as missing)."""
    from learner.evaluation.report import SUMMARY_FILE

    results = DemoResults(size, device, paths, stages)
    results.pairs = sum(len(_jsonl(p)) for p in sorted(paths.pairs.glob("pairs_l*.jsonl")))
    results.evals = {p: _json(paths.eval / p / SUMMARY_FILE) for p in POLICIES}
    for policy in POLICIES:
        for problem in search_problems(size, paths):
            results.searches.append(
                SearchRow(
                    problem.stem,
                    _problem_ops(paths, problem),
                    policy,
                    _json(search_outcome(paths, policy, problem)),
                )
            )
    results.sft = sft_figures(_jsonl(paths.sft / "metrics.jsonl"))
    results.rl = rl_figures(_jsonl(paths.rl / "metrics.jsonl"))
    return results


# --------------------------------------------------------------------------------------------
# The Markdown page
# --------------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _times(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _policy_label(results: DemoResults, policy: str) -> str:
    if policy == TEACHER:
        return "teacher"
    size = results.size
    return f"trained ({size.preset}: SFT {size.sft_steps} + DRPO {size.rl_steps} steps)"


def _search_totals(rows: Sequence[SearchRow]) -> tuple[str, str]:
    done = [r.outcome for r in rows if r.outcome is not None]
    if not done:
        return "-", "-"
    correct = sum(o.get("verdict") == "correct" for o in done)
    converted = sum(int(o.get("converted_ops") or 0) for o in done)
    total = sum(int(o.get("total_ops") or 0) for o in done)
    return f"{correct}/{len(done)}", f"{converted}/{total}"


def results_table(results: DemoResults) -> str:
    """One row per policy: evaluation figures and search totals."""
    header = [
        "policy",
        "eval problems",
        "pass@1",
        "Faster1 vs eager",
        "mean speedup vs eager",
        "search: correct",
        "search: ops in Triton",
    ]
    rows = []
    for policy in POLICIES:
        summary = results.evals.get(policy)
        overall = (summary or {}).get("overall") or {}
        if results.size.timing and overall:
            faster = _percent(overall["faster1"].get("eager"))
            speedup = _times(overall["mean_speedup"].get("eager"))
        else:
            faster = speedup = NOT_TIMED if overall else "-"
        correct, converted = _search_totals([r for r in results.searches if r.policy == policy])
        rows.append(
            [
                _policy_label(results, policy),
                str(overall.get("problems", "-")),
                _percent((overall.get("pass_at_k") or {}).get("1")) if overall else "-",
                faster,
                speedup,
                correct,
                converted,
            ]
        )
    return table(header, rows)


def search_table(results: DemoResults) -> str:
    rows = []
    for row in results.searches:
        o = row.outcome
        if o is None:
            rows.append([row.problem, " ".join(row.ops), row.policy, "missing", "-", "-", "-"])
            continue
        speedup = _times(o.get("speedup_vs_eager")) if o.get("timed") else NOT_TIMED
        rows.append(
            [
                row.problem,
                " ".join(row.ops),
                row.policy,
                str(o.get("verdict")),
                f"{o.get('converted_ops', 0)}/{o.get('total_ops', 0)}",
                str(o.get("verification", "-")),
                speedup,
            ]
        )
    header = ["problem", "operators", "policy", "verdict", "ops in Triton", "verified", "speedup"]
    return table(header, rows)


def training_table(results: DemoResults) -> str:
    sft, rl = results.sft, results.rl
    sft_cells = [f"{results.pairs} verified teacher pairs"]
    for key, label in (
        ("train/loss", "train loss"),
        ("eval/heldout_loss", "held-out loss"),
    ):
        if key in sft:
            sft_cells.append(f"{label} {sft[key]:.3f}")
    passes = [v for k, v in sft.items() if k.endswith("pass_at_1")]
    if passes:
        sft_cells.append(f"held-out pass@1 {_percent(passes[-1])}")
    rl_cells = [
        f"{rl.get('n_correct', 0)}/{rl.get('n_samples', 0)} samples correct",
        f"{rl.get('n_sent', 0)} sent to the sandbox",
        f"{rl.get('n_unparsable', 0)} without parsable code",
        f"{rl.get('n_truncated', 0)} cut at the token limit",
    ]
    rows = [
        ["SFT", str(sft.get("steps", "-")), ", ".join(sft_cells)],
        ["DRPO", str(rl.get("steps", "-")), ", ".join(rl_cells)],
    ]
    return table(["run", "steps", "figures"], rows)


def stages_table(stages: Sequence[StageTime]) -> str:
    rows = [[s.name, s.title, f"{s.seconds:.1f}", s.how] for s in stages]
    ran = sum(s.seconds for s in stages if s.how != "reused")
    rows.append(["total", "(stages run this time)", f"{ran:.1f}", ""])
    return table(["stage", "what", "seconds", ""], rows)


def disclaimer(results: DemoResults) -> str:
    size = results.size
    if size.toy:
        return (
            f"> This {results.device.upper()} run trains a toy: the `{size.preset}` model for "
            f"{plural(size.sft_steps, 'SFT step')} on {plural(results.pairs, 'teacher pair')}, "
            f"then {plural(size.rl_steps, 'DRPO step')}. Its pass@1 is not the point; the pipeline is: every stage ran end to "
            "end, each kernel judged by the sandbox. The teacher row shows what the loop "
            "learns from."
            + (
                " Without a GPU the sandbox checks correctness only, so speedups are n/a."
                if not size.timing
                else ""
            )
            + "\n"
        )
    return (
        f"> A short run of the `{size.preset}` preset ({size.sft_steps} SFT + {size.rl_steps} "
        "DRPO steps): the loop at a larger size, not a trained policy. The paper-scale "
        "results and their commands are in bench/RESULTS.md.\n"
    )


def markdown(results: DemoResults) -> str:
    """The report page (see the module docstring)."""
    size = results.size
    parts = [
        f"# DRTriton demo ({size.name} size, {results.device})\n",
        disclaimer(results),
        "## Results\n",
        f"Evaluation: {plural(size.eval_count, 'synthetic program')} per level, levels "
        f"{', '.join(str(level) for level in size.eval_levels)} ({size.profile} shapes), one "
        f"sample each. Search: {plural(len(search_problems(size, results.paths)), 'program')} "
        f"of levels {', '.join(str(level) for level, n in size.search_programs if n)}, "
        f"{plural(size.search_samples, 'sample')} per fragment.\n",
        results_table(results),
        "\n## Test-time search\n",
        search_table(results),
        "\n## Training\n",
        training_table(results),
        "\n## Stages\n",
        stages_table(results.stages),
    ]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# The speedup curve
# --------------------------------------------------------------------------------------------


def write_curve(results: DemoResults, path: Path) -> Path:
    """Both policies' fraction of problems faster than x, against eager and torch.compile."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    baselines = ("eager", "compile")
    for axis, baseline in zip(fig.subplots(1, 2), baselines, strict=True):
        drawn = False
        for index, policy in enumerate(POLICIES):
            curve = ((results.evals.get(policy) or {}).get("curve")) or {}
            values = (curve.get(baseline) or {}).get("all")
            if values and results.size.timing:
                label = _policy_label(results, policy)
                axis.step(curve["grid"], values, where="post", label=label, color=f"C{index}")
                drawn = True
        if drawn:
            axis.legend(fontsize=8)
        else:
            note = "not timed (the CPU sandbox checks correctness only)"
            axis.text(0.5, 0.5, note, ha="center", va="center", transform=axis.transAxes)
        axis.axvline(1.0, color="grey", linestyle=":", linewidth=1)
        axis.set_xlim(0, 4)
        axis.set_ylim(0, 1.02)
        axis.set_xlabel(f"speedup x over {'torch.compile' if baseline == 'compile' else 'eager'}")
        axis.set_ylabel("fraction of problems faster than x")
        axis.grid(alpha=0.3)
    fig.suptitle(f"DRTriton demo ({results.size.name} size): evaluation speedup curves")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path
