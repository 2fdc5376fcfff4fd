"""An evaluation's results for people: summary.json, report.md and speedup_curve.png.

`write_report(RUN)` reads the run directory (settings, problems, sample lines) and writes
the three files (each atomically); it can be run again at any time, also on a run cut
short, whose report says how many problems are done. `compare_runs(A, B)` sets two
summaries side by side as a Markdown table.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learner.evaluation import metrics, store
from learner.evaluation.metrics import BASELINES, DEFAULT_GRID, ProblemOutcome

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
CURVE_FILE = "speedup_curve.png"
ALL = "all"


class ReportError(ValueError):
    """Nothing to report on (not a run directory, no summary to compare)."""


def build_summary(
    settings: store.EvalSettings | None, total: int, outcomes: Sequence[ProblemOutcome]
) -> dict[str, Any]:
    """The JSON summary: figures for the whole suite and per level, and the curves."""
    ks = metrics.reported_ks(settings.samples if settings and not settings.search else 1)
    timed = {b: metrics.is_timed(outcomes, b) for b in BASELINES}
    scopes = {ALL: list(outcomes)}
    scopes.update({str(level): group for level, group in metrics.by_level(outcomes).items()})
    figures = {
        scope: metrics.summarize(group, ks, timed).to_dict() for scope, group in scopes.items()
    }
    curves = {
        b: {
            scope: metrics.speedup_curve(group, b, DEFAULT_GRID, timed[b])
            for scope, group in scopes.items()
        }
        for b in BASELINES
    }
    return {
        "settings": settings.to_dict() if settings else None,
        "problems_total": total,
        "problems_done": len(outcomes),
        "overall": figures.pop(ALL),
        "levels": figures,
        "curve": {"grid": list(DEFAULT_GRID), **curves},
    }


def write_report(run_dir: Path | str) -> dict[str, Any]:
    """Write RUN/summary.json, RUN/report.md and RUN/speedup_curve.png; returns the summary."""
    run_dir = Path(run_dir)
    problems = store.read_problems(run_dir)
    summary = build_summary(
        store.read_settings(run_dir), len(problems), store.read_outcomes(run_dir)
    )
    store.write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    store.write_atomic(run_dir / REPORT_FILE, markdown_report(summary))
    write_curve_png(summary, run_dir / CURVE_FILE)
    return summary


def read_summary(run_dir: Path | str) -> dict[str, Any]:
    path = Path(run_dir) / SUMMARY_FILE
    if not path.is_file():
        raise ReportError(
            f"{run_dir}: no {SUMMARY_FILE} (not an evaluation run, or never reported)"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReportError(f"{path}: unreadable ({err})") from None


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def times(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def _rows(summary: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(ALL, summary["overall"]), *summary["levels"].items()]


def metric_cells(figures: dict[str, Any]) -> dict[str, str]:
    """One scope's figures as table cells, in column order."""
    cells = {"problems": str(figures["problems"]), "judged": str(figures["judged"])}
    cells.update({f"pass@{k}": percent(v) for k, v in figures["pass_at_k"].items()})
    for b in BASELINES:
        cells[f"Faster1 vs {b}"] = percent(figures["faster1"][b])
    for b in BASELINES:
        cells[f"mean speedup vs {b}"] = times(figures["mean_speedup"][b])
        cells[f"geomean speedup vs {b}"] = times(figures["geomean_speedup"][b])
    return cells


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _title(summary: dict[str, Any]) -> str:
    s = summary.get("settings") or {}
    what = s.get("problems") if s.get("suite") == "kernelbench" else s.get("profile")
    search = "with search" if s.get("search") else "without search"
    return f"{s.get('policy', '?')} on {s.get('suite', '?')} ({what}), {search}"


def markdown_report(summary: dict[str, Any]) -> str:
    rows = _rows(summary)
    cells = [(scope, metric_cells(figures)) for scope, figures in rows]
    header = ["level", *cells[0][1]]
    out = [f"# Evaluation: {_title(summary)}\n"]
    if summary["problems_done"] < summary["problems_total"]:
        out.append(
            f"Partial run: {summary['problems_done']} of {summary['problems_total']} problems "
            "done (rerun with --resume to finish).\n"
        )
    s = summary.get("settings") or {}
    out.append(
        f"Samples per problem: {s.get('samples', '?')}; timing: {s.get('timing', '?')}. "
        "Rates are over judged problems; speedups are of the fastest correct kernel per "
        "problem.\n"
    )
    if all(summary["overall"]["faster1"][b] is None for b in BASELINES):
        out.append("Speedups n/a: the sandbox did not time kernels (no GPU, or timing off).\n")
    out.append(table(header, [[scope, *c.values()] for scope, c in cells]))
    verdicts = sorted({v for _, f in rows for v in f["verdicts"]})
    out.append("\n## Verdicts (fraction of problems)\n")
    out.append(
        table(
            ["level", *verdicts],
            [[scope, *(percent(f["verdicts"].get(v, 0.0)) for v in verdicts)] for scope, f in rows],
        )
    )
    return "\n".join(out)


def compare_runs(run_a: Path | str, run_b: Path | str) -> str:
    """Both runs' figures, scope by scope (the whole suite, then each common level)."""
    a, b = read_summary(run_a), read_summary(run_b)
    levels_a, levels_b = dict(_rows(a)), dict(_rows(b))
    scopes = [s for s in levels_a if s in levels_b]
    out = [
        "# Comparison\n",
        f"- A: `{run_a}`: {_title(a)}\n- B: `{run_b}`: {_title(b)}\n",
    ]
    rows = []
    for scope in scopes:
        cells_a, cells_b = metric_cells(levels_a[scope]), metric_cells(levels_b[scope])
        for name in dict.fromkeys([*cells_a, *cells_b]):
            rows.append([scope, name, cells_a.get(name, "-"), cells_b.get(name, "-")])
    out.append(table(["level", "metric", "A", "B"], rows))
    only = [s for s in [*levels_a, *levels_b] if s not in scopes]
    if only:
        out.append(f"\nLevels in one run only: {', '.join(sorted(set(only)))}\n")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# The speedup curve
# --------------------------------------------------------------------------------------------


def write_curve_png(summary: dict[str, Any], path: Path) -> Path:
    """The fraction of problems faster than x, against eager and against torch.compile, one
    line per level and one for all (the paper's figure 4)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    curve = summary["curve"]
    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    for axis, baseline in zip(fig.subplots(1, len(BASELINES)), BASELINES, strict=True):
        drawn = False
        for index, (scope, values) in enumerate(curve[baseline].items()):
            if values is not None:
                label = "all levels" if scope == ALL else f"level {scope}"
                color = "black" if scope == ALL else f"C{index - 1}"  # the same in both panels
                width = 2.4 if scope == ALL else 1.3
                axis.step(curve["grid"], values, where="post", label=label, color=color, lw=width)
                drawn = True
        if drawn:
            axis.legend(fontsize=8)
        else:
            axis.text(0.5, 0.5, "not timed", ha="center", va="center", transform=axis.transAxes)
        axis.axvline(1.0, color="grey", linestyle=":", linewidth=1)
        axis.set_xlim(curve["grid"][0], curve["grid"][-1])
        axis.set_ylim(0, 1.02)
        axis.set_xlabel(f"speedup x over {'torch.compile' if baseline == 'compile' else 'eager'}")
        axis.set_ylabel("fraction of problems faster than x")
        axis.grid(alpha=0.3)
    fig.suptitle(_title(summary), fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path
