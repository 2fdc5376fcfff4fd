"""`drtriton synth ...`: generate programs and summarise generated files.

Registration imports nothing heavy; the handlers import torch/ortools when they run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    synth = subparsers.add_parser(
        "synth", help="generate random PyTorch programs with solved shapes (CSP-DAG)"
    )
    sub = synth.add_subparsers(dest="synth_command", metavar="SUBCOMMAND")
    synth.set_defaults(handler=lambda args: _help(synth))

    gen = sub.add_parser("generate", help="write N programs of one level to a JSONL file")
    gen.add_argument("--level", type=int, required=True, help="number of operators per program")
    gen.add_argument("--count", type=int, required=True, help="number of programs")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--profile", default="tiny", help="size profile: tiny, paper, or a JSON profile file"
    )
    gen.add_argument(
        "--ops", default=None, help="comma-separated operators to draw from (default: all)"
    )
    gen.add_argument(
        "--workers", type=int, default=1, help="processes (output does not depend on it)"
    )
    gen.add_argument("--out", type=Path, required=True, help="output .jsonl (written atomically)")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.set_defaults(handler=_generate)

    stats = sub.add_parser("stats", help="operator coverage, level and FLOPs histograms")
    stats.add_argument("file", type=Path, help="a JSONL file from `synth generate`")
    stats.add_argument("--png", type=Path, default=None, help="plot path (default: FILE.stats.png)")
    stats.set_defaults(handler=_stats)

    from synth.kernelbench.cli import register as register_kernelbench

    register_kernelbench(sub)

    try:
        from synth.teacher.cli import register as register_teacher
    except ModuleNotFoundError as err:
        if not (err.name and "synth.teacher.cli".startswith(err.name)):
            raise
        register_teacher = None
    if register_teacher is not None:
        register_teacher(subparsers)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _usage(message: str) -> Exception:
    from drtriton_cli import UsageError

    return UsageError(message)


def _generate(args: argparse.Namespace) -> int:
    from synth.operators import REGISTRY
    from synth.profiles import load_profile
    from synth.store import OutputError, ResumableJsonl

    try:
        profile = load_profile(args.profile)
    except (KeyError, ValueError, OSError) as err:
        raise _usage(str(err).strip("'\"")) from None
    ops = None
    if args.ops is not None:
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        unknown = [o for o in ops if o not in REGISTRY]
        if unknown:
            raise _usage(
                f"unknown operator(s): {', '.join(unknown)} (see synth.operators.REGISTRY)"
            )
        if not ops:
            raise _usage("--ops is empty")
    if not 1 <= args.level <= profile.max_level:
        raise _usage(f"--level must be in [1, {profile.max_level}] for profile {profile.name!r}")
    if args.count < 0:
        raise _usage("--count must be >= 0")
    if args.workers < 1:
        raise _usage("--workers must be >= 1")

    from synth.generate import Unsatisfiable, generate_programs
    from synth.program import ProgramRecord

    run = {
        "format": 1,
        "level": args.level,
        "seed": args.seed,
        "profile": profile.to_dict(),
        "ops": ops,
    }
    out = ResumableJsonl(args.out, run)
    try:
        done = out.open(limit=args.count)
    except OutputError as err:
        raise _usage(str(err)) from None
    seen = [ProgramRecord.from_json(line).program.hash for line in done]
    progress = _progress(args, len(done))
    try:
        for record in generate_programs(
            args.level,
            args.count,
            args.seed,
            profile,
            ops,
            args.workers,
            start=len(done),
            seen=seen,
        ):
            out.append(record.to_json())
            progress.update(1)
        progress.close()
        out.commit()
    except Unsatisfiable as err:
        raise _usage(str(err)) from None
    finally:
        progress.close()
        out.close()
    print(f"wrote {args.count} programs to {args.out}", file=sys.stderr)
    return 0


def _progress(args: argparse.Namespace, initial: int):
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: worker processes are forked later
    return tqdm(
        total=args.count,
        initial=initial,
        unit="prog",
        file=sys.stderr,
        disable=args.quiet,
        desc=f"level {args.level}",
    )


def _stats(args: argparse.Namespace) -> int:
    from synth.stats import collect, plot, read_records, report

    if not args.file.is_file():
        raise _usage(f"{args.file}: no such file")
    try:
        stats = collect(read_records(args.file))
    except (ValueError, KeyError) as err:
        raise _usage(f"{args.file}: not a synth JSONL file ({err})") from None
    png = args.png or args.file.with_name(args.file.name + ".stats.png")
    try:
        plot(stats, png)
    except OSError as err:
        raise _usage(f"cannot write {png}: {err.strerror}") from None
    print(report(stats))
    print(f"\nplot: {png}")
    return 0
