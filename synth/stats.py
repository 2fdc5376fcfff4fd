"""Summaries of a generated JSONL file: operator coverage, levels, FLOPs.

`collect` reads the records, `report` prints them as text, `plot` draws the three
histograms into one PNG (matplotlib, non-interactive backend).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from synth.operators import OPERATOR_NAMES


@dataclass
class Stats:
    programs: int = 0
    op_uses: Counter[str] = field(default_factory=Counter)
    """Operator -> number of applications over all programs."""
    levels: Counter[int] = field(default_factory=Counter)
    flops_log2: Counter[int] = field(default_factory=Counter)
    """floor(log2(FLOPs)) -> number of programs."""
    profiles: Counter[str] = field(default_factory=Counter)

    @property
    def missing(self) -> list[str]:
        return [name for name in OPERATOR_NAMES if not self.op_uses[name]]

    @property
    def coverage(self) -> float:
        return 1 - len(self.missing) / len(OPERATOR_NAMES)


def read_records(path: Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as err:
                    raise ValueError(f"{path}:{n}: not a JSON line") from err


def collect(records: Iterable[dict]) -> Stats:
    stats = Stats()
    for rec in records:
        stats.programs += 1
        stats.op_uses.update(rec["ops"])
        stats.levels[int(rec["level"])] += 1
        stats.flops_log2[int(math.log2(max(1, int(rec["flops"]))))] += 1
        stats.profiles[str(rec.get("profile", "?"))] += 1
    return stats


def report(stats: Stats) -> str:
    lines = [
        f"programs: {stats.programs}   profiles: "
        + ", ".join(f"{k} ({v})" for k, v in sorted(stats.profiles.items())),
        f"operator coverage: {len(OPERATOR_NAMES) - len(stats.missing)}/{len(OPERATOR_NAMES)}"
        + (f"   missing: {', '.join(stats.missing)}" if stats.missing else ""),
        "",
        "operator uses:",
    ]
    width = max(len(n) for n in OPERATOR_NAMES)
    total = sum(stats.op_uses.values()) or 1
    names = list(OPERATOR_NAMES) + sorted(set(stats.op_uses) - set(OPERATOR_NAMES))
    for name in names:
        n = stats.op_uses[name]
        lines.append(f"  {name:<{width}} {n:>8}  {100 * n / total:5.2f}%")
    lines += ["", "levels:"]
    lines += [f"  {level:>4} {n:>8}" for level, n in sorted(stats.levels.items())]
    lines += ["", "FLOPs (log2 bucket):"]
    lines += [f"  2^{b:<3} {n:>8}" for b, n in sorted(stats.flops_log2.items())]
    return "\n".join(lines)


def plot(stats: Stats, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(14, 12))
    ax = axes[0]
    ax.bar(range(len(OPERATOR_NAMES)), [stats.op_uses[n] for n in OPERATOR_NAMES])
    ax.set_xticks(range(len(OPERATOR_NAMES)), OPERATOR_NAMES, rotation=90, fontsize=7)
    ax.set_title(f"operator uses ({stats.programs} programs, coverage {stats.coverage:.0%})")
    ax = axes[1]
    levels = sorted(stats.levels)
    ax.bar([str(v) for v in levels], [stats.levels[v] for v in levels])
    ax.set_title("programs per level")
    ax = axes[2]
    buckets = sorted(stats.flops_log2)
    ax.bar([f"2^{b}" for b in buckets], [stats.flops_log2[b] for b in buckets])
    ax.set_title("programs per FLOPs bucket")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
