"""`drtriton train plot RUN_DIR`: learning curves from RUN_DIR/metrics.jsonl as one PNG.

One panel per group of related figures that the run recorded (SFT: loss, pass@1, learning
rate, throughput; RL: reward, correctness, speedup, KL, verification rate, step time).
Metric names are matched by suffix, so `train/loss` and `rl/loss` both land in "loss".
"""

from __future__ import annotations

from pathlib import Path

from learner.train.metrics import iter_series, read_metrics

PLOT_FILE = "curves.png"

# (panel title, metric name suffixes drawn in it)
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("loss", "heldout_loss")),
    ("held-out pass@1", ("pass_at_1",)),
    ("reward", ("reward_mean", "correct_rate")),
    ("speedup", ("speedup_mean", "speedup_geomean")),
    ("KL", ("kl", "kl_ref")),
    ("learning rate", ("lr",)),
    ("gradient norm", ("grad_norm",)),
    ("tokens / s", ("tokens_per_s",)),
    ("verifications / s", ("verifications_per_s",)),
    ("seconds per step", ("step_seconds", "sample_seconds", "verify_seconds", "update_seconds")),
)


class PlotError(ValueError):
    """Nothing to plot (no run directory, no metrics)."""


def panels_for(keys: set[str]) -> list[tuple[str, list[str]]]:
    """The panels whose metrics appear among `keys`, each with the full keys to draw."""
    out = []
    for title, suffixes in PANELS:
        drawn = sorted(k for k in keys if k.rsplit("/", 1)[-1] in suffixes)
        if drawn:
            out.append((title, drawn))
    return out


def plot_run(run_dir: Path | str, out: Path | str | None = None) -> Path:
    """Write the learning curves of `run_dir` (default RUN_DIR/curves.png); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise PlotError(f"{run_dir}: no such run directory")
    records = read_metrics(run_dir)
    keys = {k for r in records for k, v in r.items() if k not in ("step", "time") and v is not None}
    panels = panels_for(keys)
    if not panels:
        raise PlotError(f"{run_dir}: no metrics to plot (metrics.jsonl is missing or empty)")
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, (title, drawn) in zip(axes.flat, panels, strict=False):
        for key in drawn:
            series = list(iter_series(records, key))
            steps, values = zip(*series, strict=True)
            ax.plot(steps, values, marker="o" if len(series) < 30 else None, ms=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if title == "learning rate" or len(drawn) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    target = Path(out) if out is not None else run_dir / PLOT_FILE
    tmp = target.with_name(target.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(target)
    return target
