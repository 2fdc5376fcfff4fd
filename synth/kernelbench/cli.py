"""`drtriton synth kernelbench DIR_OR_FILES --out problems.jsonl`.

One JSON line per problem (`id`, `name`, `level`, `source`, `ok`, `reason`, plus `ops`,
`param_inputs`, `unmapped_ops`, `path`), failures included with their reason and
`source: null`; a summary table per level and the failures with their reasons.
Registration imports nothing heavy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BUNDLED = Path(__file__).resolve().parent / "problems"


def register(sub: argparse._SubParsersAction) -> None:
    """Add `kernelbench` to the `drtriton synth` subcommands."""
    parser = sub.add_parser(
        "kernelbench",
        help="rewrite KernelBench-format problems (Model/get_inputs) into functional programs",
        description=(
            "Export each problem with torch.export, rewrite it into the functional format "
            "and check it against the Model on fresh inputs. Every problem gets a record; "
            f"a failure carries its reason. Bundled problems: {BUNDLED}"
        ),
    )
    parser.add_argument(
        "paths", nargs="+", type=Path, help="problem files, or directories searched for *.py"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output .jsonl (written atomically)"
    )
    parser.add_argument(
        "--level",
        type=int,
        default=None,
        help="level of every problem (default: from a levelN dir)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_run)


def _usage(message: str) -> Exception:
    from drtriton_cli import UsageError

    return UsageError(message)


def _run(args: argparse.Namespace) -> int:
    from synth.kernelbench.load import ProblemError, problem_files
    from synth.store import OutputError, check_writable

    try:
        files = problem_files(args.paths)
    except ProblemError as err:
        raise _usage(str(err)) from None
    if not files:
        raise _usage("no problem files (*.py) in " + ", ".join(map(str, args.paths)))
    try:
        check_writable(args.out)
    except OutputError as err:
        raise _usage(str(err)) from None
    results = _export_all(files, args.level, quiet=args.quiet)
    write_jsonl(args.out, [result.to_record() for result in results])
    _summary(results, args.out)
    return 0


def _export_all(files: Sequence[Path], level: int | None, *, quiet: bool) -> list[Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from synth.kernelbench.export import export_problem

    results = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ok {task.fields[ok]}"),
        TimeElapsedColumn(),
    )
    console = Console(file=sys.stderr)
    with Progress(*columns, console=console, disable=quiet, transient=True) as progress:
        task = progress.add_task("export", total=len(files), ok=0)
        for path in files:
            progress.update(task, description=f"export {path.stem}")
            results.append(export_problem(path, level=level))
            ok = sum(r.ok for r in results)
            progress.update(task, advance=1, ok=ok)
    return results


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write records as JSON lines, atomically (a temporary file renamed over `path`)."""
    with tempfile.NamedTemporaryFile(
        "w", dir=path.resolve().parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    ) as handle:
        try:
            for record in records:
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
        except BaseException:
            handle.close()
            Path(handle.name).unlink(missing_ok=True)
            raise
    os.replace(handle.name, path)


def _summary(results: Sequence[Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"KernelBench export: {out}")
    for column in ("level", "problems", "ok", "failed", "registry only"):
        table.add_column(column, justify="right")
    levels = sorted({r.level for r in results}, key=lambda x: (x is None, x))
    for level in levels:
        rows = [r for r in results if r.level == level]
        table.add_row(
            str(level) if level is not None else "?",
            str(len(rows)),
            str(sum(r.ok for r in rows)),
            str(sum(not r.ok for r in rows)),
            str(sum(r.ok and not r.unmapped_ops for r in rows)),
        )
    console.print(table)
    kept = Counter(op for r in results if r.ok for op in r.unmapped_ops)
    if kept:
        listed = ", ".join(f"{op} ({n})" for op, n in kept.most_common())
        console.print(f"kept as PyTorch (problems using it): {listed}", highlight=False)
    failed = [r for r in results if not r.ok]
    if failed:
        failures = Table(title="failed")
        failures.add_column("problem")
        failures.add_column("reason", overflow="fold")
        for r in failed:
            failures.add_row(r.name, r.reason or "")
        console.print(failures)
