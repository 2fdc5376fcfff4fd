"""The `drtriton` command line: one entry point, one module of subcommands per part.

Each part exposes `register(subparsers)` in its own `cli.py`. Registration imports
nothing heavy, so `drtriton sandbox ...` never loads jax and `drtriton model ...`
never loads torch or triton; handlers import what they need when they run.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules whose `register(subparsers)` adds subcommands, in help order.
PART_CLIS = (
    "sandbox.cli",
    "synth.cli",
    "learner.cli",
    "learner.train.cli",
    "learner.evaluation.cli",
    "learner.search.cli",
    "drtriton_demo.cli",
)


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="drtriton",
        description="Train models to write fast, correct Triton kernels, and verify them safely.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in PART_CLIS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # that part is not present in this checkout
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Under `python -m drtriton_cli` this module is `__main__`; parts import
    # `drtriton_cli.UsageError`, which must be this very class.
    sys.modules.setdefault("drtriton_cli", sys.modules[__name__])
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except sys.modules["drtriton_cli"].UsageError as err:
        print(f"drtriton: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("drtriton: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
