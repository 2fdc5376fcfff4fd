"""Training metrics: RUN_DIR/metrics.jsonl (+ TensorBoard) and a progress line.

Each `write` appends one JSON object per line, `{"step": 12, "time": 1733.5, "train/loss":
2.31, "train/lr": 0.001, ...}`: the prefix names the phase (`train`, `eval`, `rl`, ...).
Only process 0 writes. A resumed run first drops the lines past its checkpoint's step
(`truncate_after`), so the file reads like one uninterrupted run. TensorBoard event files
go to RUN_DIR/tensorboard when tensorboardX is installed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (a torn last line, from a kill mid-write, is skipped)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    records = []
    if not path.is_file():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _finite_float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def summary_writer_class() -> Any:
    """tensorboardX's `SummaryWriter`, or None when it is not installed.

    tensorboardX imports torch at import time whenever torch is installed (for tensor types
    the learner never logs); the learner process must not load torch, so the import runs
    with torch hidden unless something already loaded it.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` fail
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return None
    finally:
        if hide and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    """Appends metrics of one run; `tensorboard=False` or no tensorboardX: JSONL only."""

    def __init__(self, run_dir: Path | str, *, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = jax.process_index() == 0
        self._tb: Any = None
        if not self.enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        writer_class = summary_writer_class() if tensorboard else None
        if writer_class is not None:
            self._tb = writer_class(str(self.run_dir / TENSORBOARD_DIR), flush_secs=30)

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (a resumed run rewrites them); atomic replace."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [r for r in read_metrics(self.path) if int(r.get("step", 0)) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)

    def write(self, step: int, metrics: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        """Record `metrics` (numbers; non-finite become null) at `step` under `prefix/`."""
        record: dict[str, Any] = {"step": int(step), "time": round(time.time(), 3)}
        for name, value in metrics.items():
            record[f"{prefix}/{name}" if prefix else name] = _finite_float(value)
        if not self.enabled:
            return record
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if key not in ("step", "time") and value is not None:
                    self._tb.add_scalar(key, value, int(step))
        return record

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------

# Figures shown on the progress line, in order: (metric suffix, label, format).
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("loss", "loss", "{:.4f}"),
    ("heldout_loss", "held-out", "{:.4f}"),
    ("pass_at_1", "pass@1", "{:.1%}"),
    ("reward_mean", "reward", "{:.3f}"),
    ("lr", "lr", "{:.2e}"),
    ("tokens_per_s", "tok/s", "{:,.0f}"),
    ("verifications_per_s", "verif/s", "{:.1f}"),
    ("sandbox_wait_s", "sandbox wait", "{:.1f}s"),
)


def format_figures(figures: Mapping[str, Any]) -> str:
    """`loss 1.2345 · pass@1 50.0% · ...` from metric names (any prefix) to numbers."""
    by_suffix = {key.rsplit("/", 1)[-1]: value for key, value in figures.items()}
    parts = []
    for suffix, label, fmt in FIGURES:
        value = by_suffix.get(suffix)
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    return " · ".join(parts)


class ProgressBar:
    """A rich progress bar over steps with the latest figures; on a non-terminal (a log file)
    one plain line per `update` instead. Disabled on processes other than 0."""

    def __init__(self, total: int, *, initial: int = 0, enabled: bool = True, title: str = "train"):
        self.enabled = enabled and jax.process_index() == 0
        self.figures: dict[str, Any] = {}
        self.total = total
        self.title = title
        self._progress: Any = None
        if not self.enabled or not sys.stderr.isatty():
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[figures]}"),
            transient=False,
        )
        self._task = self._progress.add_task(title, total=total, completed=initial, figures="")
        self._progress.start()

    def update(self, step: int, figures: Mapping[str, Any] | None = None) -> None:
        """Move to `step`; remember `figures` (the newest value of each is shown)."""
        if not self.enabled:
            return
        if figures:
            self.figures.update({k: v for k, v in figures.items() if v is not None})
        text = format_figures(self.figures)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, figures=text)
        elif figures:
            print(f"{self.title} step {step}/{self.total} · {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_series(records: list[dict[str, Any]], key: str) -> Iterator[tuple[int, float]]:
    """(step, value) of every record that has a finite `key`."""
    for record in records:
        value = record.get(key)
        if value is not None:
            yield int(record["step"]), float(value)
