"""`drtriton demo`: the whole loop, on embedded sizes (registration imports nothing heavy)."""

from __future__ import annotations

import argparse
from pathlib import Path

from drtriton_demo.sizes import SIZE_NAMES
from drtriton_demo.stages import STAGE_NAMES

DESCRIPTION = """\
The whole DRTriton loop on embedded sizes: random programs -> teacher kernels verified by
the sandbox -> SFT of a small policy -> a few DRPO steps -> test-time search with the
teacher and the trained policy -> evaluation of both on a synthetic suite -> a Markdown
table and a speedup curve. A sandbox server on loopback serves every stage; it is started
and stopped by the demo.

On a CPU machine it trains a toy (the tiny-cpu preset) in under 10 minutes; with an
NVIDIA GPU it uses the 100m-gpu preset and times kernels. Rerunning reuses the stages
already done (--fresh starts over). Every stage is a `drtriton` command; their logs are in
OUT/logs and the report in OUT/REPORT.md.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the whole loop: programs, teacher, SFT, DRPO, search, evaluation",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/demo"), help="output directory (runs/demo)"
    )
    parser.add_argument(
        "--size",
        choices=("auto", *SIZE_NAMES),
        default="auto",
        help="auto: gpu with an NVIDIA GPU, else cpu; smoke: the smallest loop",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated programs")
    parser.add_argument("--fresh", action="store_true", help="remove OUT first and start over")
    parser.add_argument("--until", choices=STAGE_NAMES, help="stop after this stage (no report)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from drtriton_cli import UsageError
    from drtriton_demo.pipeline import DemoError, DemoOptions, run_demo

    options = DemoOptions(
        out=args.out,
        size=args.size,
        device=args.device,
        seed=args.seed,
        fresh=args.fresh,
        until=args.until,
    )
    try:
        return run_demo(options)
    except DemoError as err:
        raise UsageError(str(err)) from None
