"""`drtriton eval`, `drtriton eval compare A B`, `drtriton eval report RUN`.

    drtriton eval --suite synthetic --levels 1,2 --policy teacher --out runs/eval/x
        [--server local|HOST:PORT] [--samples K] [--search] [--resume]
    drtriton eval --suite kernelbench --problems problems.jsonl|DIR --policy ... --out ...
    drtriton eval compare runs/eval/a runs/eval/b [--out compare.md]
    drtriton eval report runs/eval/x          (writes the report again, e.g. of a cut run)

Bad input (an unknown suite, a missing file, an unreachable server, a run directory holding
other settings) is one line on stderr and exit status 2. Registration imports nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from learner.evaluation.suites import PROFILES, SUITES, SYNTHETIC_SEED


def _usage(message: str) -> Exception:
    """A `drtriton_cli.UsageError` (exit status 2, one line on stderr)."""
    from drtriton_cli import UsageError

    return UsageError(" ".join(str(message).split()))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a policy on synthetic levels or KernelBench problems",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--suite", default="synthetic", help=f"{' | '.join(SUITES)}")
    parser.add_argument("--levels", default="1,2,5,20", help="synthetic levels (default 1,2,5,20)")
    parser.add_argument("--profile", default="tiny", help=f"{' | '.join(PROFILES)} or a JSON file")
    parser.add_argument("--count", type=int, default=10, help="synthetic programs per level")
    parser.add_argument("--seed", type=int, default=SYNTHETIC_SEED, help="programs and samples")
    parser.add_argument("--problems", help="kernelbench: FILE.jsonl or a DIR of problems")
    parser.add_argument("--policy", help="teacher | checkpoint:PATH | hosted:URL#MODEL")
    parser.add_argument("--out", type=Path, help="run directory")
    parser.add_argument("--samples", type=int, default=1, help="samples per problem (pass@k)")
    parser.add_argument("--search", action="store_true", help="test-time search per problem")
    parser.add_argument("--max-fragment-ops", type=int, default=5, help="search fragment size")
    parser.add_argument(
        "--timing", action=argparse.BooleanOptionalAction, default=True, help="time kernels"
    )
    parser.add_argument("--trials", type=int, default=3, help="correctness trials per sample")
    parser.add_argument("--batch", type=int, default=8, help="problems per policy call")
    parser.add_argument(
        "--max-new-tokens", type=int, help="a model policy's answer length (its default: 1024)"
    )
    parser.add_argument(
        "--temperature", type=float, help="a model policy's sampling temperature (0 = greedy)"
    )
    parser.add_argument("--server", default="local", help="local | HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--workers", type=int, default=2, help="graders of a local server")
    parser.add_argument("--allow-weak-isolation", action="store_true")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(handler=_eval)
    commands = parser.add_subparsers(dest="eval_command", metavar="{compare,report}")
    compare = commands.add_parser("compare", help="two runs' summaries side by side")
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument("--out", dest="compare_out", type=Path, help="also write it here")
    compare.set_defaults(handler=_compare)
    report = commands.add_parser("report", help="write a run's report again")
    report.add_argument("run", type=Path)
    report.set_defaults(handler=_report)


def settings_from_args(args: argparse.Namespace) -> Any:
    from learner.evaluation.store import EvalSettings
    from learner.evaluation.suites import SuiteError, parse_levels

    if args.suite not in SUITES:
        raise _usage(f"unknown suite {args.suite!r}: one of {', '.join(SUITES)}")
    if not args.policy:
        raise _usage("--policy is required (teacher | checkpoint:PATH | hosted:URL#MODEL)")
    if args.out is None:
        raise _usage("--out DIR is required")
    problems = None
    if args.suite == "kernelbench":
        if not args.problems:
            raise _usage("--suite kernelbench needs --problems FILE.jsonl or DIR")
        path = Path(args.problems)
        if not path.exists():
            raise _usage(f"{path}: no such problems file or directory")
        problems = str(path.resolve())
    try:
        levels = parse_levels(args.levels)
    except SuiteError as err:
        raise _usage(str(err)) from None
    return EvalSettings(
        suite=args.suite,
        levels=levels,
        profile=args.profile,
        count=args.count,
        seed=args.seed,
        problems=problems,
        policy=args.policy,
        samples=args.samples,
        search=args.search,
        max_fragment_ops=args.max_fragment_ops,
        timing=args.timing,
        trials=args.trials,
        batch=args.batch,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
    )


def _sandbox_config(args: argparse.Namespace) -> Any:
    from learner.train.config import SandboxConfig

    servers = tuple(s.strip() for s in args.server.split(",") if s.strip())
    if not servers:
        raise _usage("--server wants 'local' or HOST:PORT")
    return SandboxConfig(
        servers=servers,
        trials=args.trials,
        timing=args.timing,
        workers=args.workers,
        device=args.device,
        allow_weak_isolation=args.allow_weak_isolation,
    )


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or an unusable environment, not a bug."""
    from learner.evaluation.report import ReportError
    from learner.evaluation.store import RunDirError
    from learner.evaluation.suites import SuiteError
    from learner.policies.base import PolicyError
    from learner.train.verify import SandboxUnreachable

    return (SuiteError, RunDirError, ReportError, PolicyError, SandboxUnreachable)


def load_policy(spec: str, **options: Any) -> Any:
    """The policy `spec` names; a spec the registry refuses is a one-line error."""
    from learner.evaluation.run import load_policy as load

    try:
        return load(spec, **options)
    except (KeyError, ValueError, FileNotFoundError) as err:
        raise _usage(f"--policy {spec}: {err}") from None


def _eval(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    sandbox = _sandbox_config(args)
    from learner.evaluation.report import REPORT_FILE
    from learner.evaluation.run import run_eval

    try:
        policy = load_policy(settings.policy, **settings.policy_options())
        summary = run_eval(
            settings,
            args.out,
            resume=args.resume,
            policy=policy,
            sandbox=sandbox,
            progress=not args.no_progress,
        )
    except _user_errors() as err:
        raise _usage(str(err)) from None
    print((args.out / REPORT_FILE).read_text())
    print(f"eval: {summary['problems_done']} problems in {args.out}", file=sys.stderr)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from learner.evaluation.report import ReportError, compare_runs
    from learner.evaluation.store import write_atomic

    try:
        text = compare_runs(args.run_a, args.run_b)
    except ReportError as err:
        raise _usage(str(err)) from None
    if args.compare_out is not None:
        write_atomic(args.compare_out, text)
    print(text)
    return 0


def _report(args: argparse.Namespace) -> int:
    from learner.evaluation.report import REPORT_FILE, write_report
    from learner.evaluation.store import RunDirError

    try:
        write_report(args.run)
    except RunDirError as err:
        raise _usage(str(err)) from None
    print((args.run / REPORT_FILE).read_text())
    return 0
