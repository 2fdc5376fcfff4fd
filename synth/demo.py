"""`drtriton demo`: the pipeline end to end on embedded defaults, on any machine.

Generates a handful of level-1 programs (CSP-DAG, `tiny` profile), has the teacher
translate each into Triton, verifies every pair in the local sandbox (Triton's
interpreter without a GPU, timed against PyTorch with one), and writes the
verified prompt/completion pairs: the seed of an SFT set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_OPS = ("relu", "add", "softmax", "sum", "matmul", "layer_norm", "gelu", "max_pool2d")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="generate programs, translate them with the teacher, verify them in the sandbox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--count", type=int, default=8, help="programs to generate (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ops", default=",".join(DEFAULT_OPS), help="operators to draw from (comma-separated)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="output directory")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.set_defaults(handler=run_demo)


def _sandbox(device: str) -> Any:
    from rich.console import Console

    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig
    from sandbox.errors import WeakIsolationError

    console = Console(stderr=True)
    try:
        return LocalSandbox(SandboxConfig(workers=2, device=device))
    except WeakIsolationError as err:
        console.print(f"[bold yellow]warning:[/] {err}")
        console.print("[bold yellow]The demo continues with WEAKER isolation on this host.[/]")
        return LocalSandbox(SandboxConfig(workers=2, device=device, allow_weak_isolation=True))


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from drtriton_cli import UsageError
    from synth.generate import generate_programs
    from synth.teacher import TranslationError, translate
    from synth.teacher.prompt import build_prompt

    if args.count < 1:
        raise UsageError("--count must be at least 1")
    console = Console(stderr=True)
    ops = [name.strip() for name in args.ops.split(",") if name.strip()]
    try:
        with console.status(f"generating {args.count} level-1 programs"):
            programs = list(generate_programs(1, args.count, args.seed, "tiny", ops))
    except (KeyError, ValueError) as err:
        raise UsageError(str(err).strip("'\"")) from None
    console.print(f"generated {len(programs)} programs over {', '.join(ops)}")
    args.out.mkdir(parents=True, exist_ok=True)
    table = Table(title="DRTriton demo: teacher kernels verified by the sandbox")
    for column in ("program", "operators", "kernels", "verdict", "speedup vs eager", "seconds"):
        table.add_column(column)
    pairs = []
    with console.status("starting the sandbox (isolated candidate processes)"):
        sandbox = _sandbox(args.device)
    with sandbox:
        for record in programs:
            started = time.monotonic()
            try:
                translation = translate(record.source)
            except TranslationError as err:
                table.add_row(
                    record.id, " ".join(record.ops), "-", f"untranslated: {err}", "-", "-"
                )
                continue
            with console.status(f"verifying {record.id} ({' '.join(record.ops)})"):
                result = sandbox.verify(record.source, translation.code, trials=5)
            speedup = f"{result.speedup_vs_eager:.2f}x" if result.speedup_vs_eager else "n/a (CPU)"
            table.add_row(
                record.id,
                " ".join(record.ops),
                str(translation.kernel_count),
                result.verdict,
                speedup,
                f"{time.monotonic() - started:.1f}",
            )
            if result.correct:
                pairs.append(
                    {
                        "id": record.id,
                        "ops": record.ops,
                        "prompt": build_prompt(record.source),
                        "completion": f"<triton_code>\n{translation.code}</triton_code>",
                        "verdict": result.verdict,
                        "speedup_vs_eager": result.speedup_vs_eager,
                    }
                )
    Console().print(table)
    path = args.out / "pairs.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as handle:
        for pair in pairs:
            handle.write(json.dumps(pair) + "\n")
    os.replace(tmp, path)
    console.print(f"{len(pairs)}/{len(programs)} verified pairs written to {path}")
    return 0 if pairs else 1


if __name__ == "__main__":
    from drtriton_cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
