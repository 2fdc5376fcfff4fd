"""`drtriton search PROBLEM.py --policy SPEC`: test-time search for one problem.

    drtriton search problem.py --policy teacher [--server local | HOST:PORT[,HOST:PORT]]
        [--samples 4] [--max-fragment-ops 5] [--no-timing] [--out result.json]
        [--write-candidate candidate.py]

Prints the verdict, the composition and the fragment table; `--out` writes the whole
outcome as JSON, `--write-candidate` the answer's module. Bad input (a missing file, a
problem that is not a straight-line program, an unknown policy, no sandbox) is one line on
stderr and exit status 2. Registration imports nothing heavy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def _usage(message: str) -> Exception:
    """A `drtriton_cli.UsageError` (exit status 2, one line on stderr)."""
    main = sys.modules.get("__main__")
    if str(getattr(main, "__file__", "")).endswith("drtriton_cli.py"):
        return main.UsageError(message)  # type: ignore[union-attr]
    from drtriton_cli import UsageError

    return UsageError(message)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "search",
        help="test-time search: kernels per fragment, the fastest correct composition",
        description="Split a functional-format program into fragments of at most K "
        "operators, ask a policy for kernels, verify them in the sandbox, and report the "
        "fastest correct composition, verified before it is reported.",
    )
    p.add_argument("problem", metavar="PROBLEM.py", help="a functional-format problem")
    p.add_argument(
        "--policy", default="teacher", help="teacher | checkpoint:PATH | hosted:URL#MODEL"
    )
    p.add_argument(
        "--server",
        default="local",
        help="sandbox servers (HOST:PORT, comma-separated) or 'local' to start one (default)",
    )
    p.add_argument("--samples", type=_positive, default=4, help="answers per fragment (4)")
    p.add_argument("--max-fragment-ops", type=_positive, default=5, help="K (default 5)")
    p.add_argument("--seed", type=int, default=0, help="the policy's sampling seed")
    p.add_argument("--trials", type=_positive, default=5, help="correctness trials per kernel")
    p.add_argument("--no-timing", action="store_true", help="correctness only (no GPU timing)")
    p.add_argument("--workers", type=_positive, default=2, help="graders of a local sandbox")
    p.add_argument("--device", default="auto", help="a local sandbox's device (auto|cpu|cuda)")
    p.add_argument(
        "--allow-weak-isolation",
        action="store_true",
        help="let a local sandbox run with weaker isolation (a host without root)",
    )
    p.add_argument("--out", help="write the outcome as JSON here")
    p.add_argument("--write-candidate", metavar="FILE.py", help="write the answer's module here")
    p.set_defaults(handler=_search)


def _write(path: str, text: str) -> None:
    """Atomically: a temporary file beside `path`, renamed over it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _is_kernelbench(source: str) -> bool:
    """A KernelBench-format problem: a `Model` class and no `fused_operator`."""
    import ast

    try:
        names = {getattr(node, "name", None) for node in ast.parse(source).body}
    except SyntaxError:
        return False
    return "Model" in names and "fused_operator" not in names


def _functional(source: str, name: str) -> str:
    """The problem in the functional format: KernelBench's `Model` rewritten through
    torch.export (`synth.kernelbench`), checked equal to the Model before use."""
    if not _is_kernelbench(source):
        return source
    from synth.kernelbench.export import export_source

    result = export_source(source, name)
    if not result.ok or result.source is None:
        raise _usage(f"the KernelBench problem could not be rewritten: {result.reason}")
    print(f"{name}: KernelBench Model rewritten into the functional format", file=sys.stderr)
    return result.source


def _search(args: argparse.Namespace) -> int:
    path = Path(args.problem)
    if not path.is_file():
        raise _usage(f"no problem file {args.problem}")
    problem = _functional(path.read_text(), path.stem)
    from learner.policies.base import PolicyError
    from learner.policies.registry import load_policy
    from learner.search.program import SearchError, parse
    from learner.search.report import composition, fragment_table, summary
    from learner.search.run import search_problem
    from learner.train.config import SandboxConfig
    from learner.train.verify import SandboxUnreachable, sandbox_client

    try:
        parse(problem)  # refuse a bad problem before starting anything
        policy = load_policy(args.policy)
    except (SearchError, PolicyError) as err:
        raise _usage(" ".join(str(err).split())) from None
    servers = tuple(s.strip() for s in args.server.split(",") if s.strip())
    cfg = SandboxConfig(
        servers=servers or ("local",),
        workers=args.workers,
        device=args.device,
        allow_weak_isolation=args.allow_weak_isolation,
    )
    try:
        with sandbox_client(cfg) as client:
            outcome = search_problem(
                problem,
                policy,
                client,
                samples=args.samples,
                max_fragment_ops=args.max_fragment_ops,
                seed=args.seed,
                timing=not args.no_timing,
                trials=args.trials,
            )
    except (SearchError, PolicyError, SandboxUnreachable) as err:
        raise _usage(" ".join(str(err).split())) from None
    print(f"search {path.name} with {getattr(policy, 'name', args.policy)}: {summary(outcome)}")
    print(f"composition: {composition(outcome)}")
    print(fragment_table(outcome))
    if args.out:
        _write(args.out, json.dumps(outcome.to_json_dict(), indent=2) + "\n")
    if args.write_candidate and outcome.candidate is not None:
        _write(args.write_candidate, outcome.candidate)
    return 0 if outcome.correct else 1
