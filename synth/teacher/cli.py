"""`drtriton teacher translate|build`: the teacher from the command line.

Registration imports nothing heavy; torch, triton and the sandbox load when a
handler runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    teacher = subparsers.add_parser(
        "teacher",
        help="translate programs to Triton without an LLM and build the SFT pairs",
        description="The teacher: template-based, verified Triton translations of functional programs.",
    )
    commands = teacher.add_subparsers(dest="teacher_command", metavar="COMMAND")
    teacher.set_defaults(handler=lambda args: _help(teacher))

    translate = commands.add_parser(
        "translate", help="print the Triton candidate module for one problem on stdout"
    )
    translate.add_argument("problem", type=Path, metavar="PROBLEM.py")
    translate.set_defaults(handler=run_translate)

    build = commands.add_parser(
        "build",
        help="translate programs, verify every pair in the sandbox, write the correct ones",
        description=(
            "Reads generator JSONL, writes one JSON line per verified (prompt, completion) pair. "
            "Resumable: rerun the same command to continue after an interruption."
        ),
    )
    build.add_argument(
        "--programs",
        type=Path,
        required=True,
        metavar="FILE.jsonl",
        help="program records, one per line, each with `source` (as `drtriton synth generate` writes)",
    )
    build.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="PAIRS.jsonl",
        help="verified pairs; progress goes to OUT.partial until the run completes",
    )
    build.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="sandbox server(s) to verify with (repeat or comma-separate); default: in-process sandbox",
    )
    build.add_argument(
        "--rejects", type=Path, metavar="FILE.jsonl", help="default: OUT.rejected.jsonl"
    )
    build.add_argument("--limit", type=int, metavar="N", help="only the first N programs")
    build.add_argument(
        "--jobs", type=int, metavar="N", help="verifications in flight (default 1, 4 per server)"
    )
    build.add_argument("--trials", type=int, default=5, help="random correctness cases per pair")
    build.add_argument("--no-timing", action="store_true", help="skip timing (no speedups)")
    build.add_argument("--atol", type=float, help="absolute tolerance (sandbox default if omitted)")
    build.add_argument("--rtol", type=float, help="relative tolerance (sandbox default if omitted)")
    build.add_argument(
        "--timeout", type=float, default=600, metavar="S", help="server mode: call deadline"
    )
    build.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="in-process sandbox only"
    )
    build.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="in-process sandbox: run even where the host lacks isolation features",
    )
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.set_defaults(handler=run_build)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_translate(args: argparse.Namespace) -> int:
    from drtriton_cli import UsageError

    from . import TranslationError, translate

    try:
        source = args.problem.read_text()
    except OSError as err:
        raise UsageError(f"cannot read {args.problem}: {err.strerror}") from None
    try:
        translation = translate(source)
    except TranslationError as err:
        raise UsageError(f"{args.problem}: {err}") from None
    sys.stdout.write(translation.code)
    return 0


def _servers(args: argparse.Namespace) -> list[str]:
    return [s.strip() for item in args.server for s in item.split(",") if s.strip()]


def _verifier(args: argparse.Namespace) -> tuple[Any, tuple[type[BaseException], ...]]:
    """The verify function for the chosen sandbox, and the errors that should stop the run."""
    options: dict[str, Any] = {"trials": args.trials, "timing": not args.no_timing}
    if args.atol is not None:
        options["atol"] = args.atol
    if args.rtol is not None:
        options["rtol"] = args.rtol
    servers = _servers(args)
    if servers:
        from sandbox.client import SandboxClient

        client = SandboxClient(servers, timeout_s=args.timeout)
        return (lambda problem, candidate: client.verify(problem, candidate, **options)), ()
    from sandbox import api
    from sandbox.errors import InvalidRequestError, WeakIsolationError

    local = {"device": args.device, "allow_weak_isolation": args.allow_weak_isolation}
    return (
        lambda problem, candidate: api.verify(problem, candidate, **local, **options),
        (WeakIsolationError, InvalidRequestError),
    )


def _count(path: Path, limit: int | None) -> int:
    with open(path) as handle:
        total = sum(1 for line in handle if line.strip())
    return min(total, limit) if limit is not None else total


def run_build(args: argparse.Namespace) -> int:
    import itertools

    from drtriton_cli import UsageError

    from .build import ProgramFileError, SandboxDown, build_pairs, read_programs

    if not args.programs.is_file():
        raise UsageError(f"no such programs file: {args.programs}")
    if args.limit is not None and args.limit < 0:
        raise UsageError("--limit must be >= 0")
    if args.trials < 1:
        raise UsageError("--trials must be at least 1")
    verify, fatal = _verifier(args)
    jobs = args.jobs or 4 * len(_servers(args)) or 1
    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    programs = read_programs(args.programs)
    if args.limit is not None:
        programs = itertools.islice(programs, args.limit)
    try:
        summary = build_pairs(
            programs,
            args.out,
            verify,
            rejects=args.rejects,
            jobs=jobs,
            progress=not args.no_progress,
            total=_count(args.programs, args.limit),
            fatal=fatal,
        )
    except ProgramFileError as err:
        raise UsageError(str(err)) from None
    except SandboxDown as err:
        raise UsageError(f"{err} (rerun to resume)") from None
    except fatal as err:
        raise UsageError(str(err).splitlines()[0]) from None
    print(summary.table())
    summary_path = args.out.with_name(args.out.stem + ".summary.json")
    summary_path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    print(f"pairs: {args.out}  summary: {summary_path}", file=sys.stderr)
    return 0 if summary.correct or not summary.programs else 1
