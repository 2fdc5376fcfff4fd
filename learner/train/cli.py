"""`drtriton train sft|rl|plot`.

    drtriton train sft --config tiny-cpu --set data.pairs=pairs.jsonl [--set k=v ...] [--run-dir D]
    drtriton train rl  --config tiny-cpu --set model.path=runs/tiny-cpu/model ...
    drtriton train plot RUN_DIR

`--config` takes a preset (tiny-cpu, 100m-gpu, 7b-cluster) or a .json/.toml file (a run's
own RUN_DIR/config.json included). Bad input (unknown keys, missing files, a run directory
holding another config, an unreachable sandbox) is one line on stderr and exit status 2,
before anything is computed. Registration imports nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _usage(message: str) -> Exception:
    """A `drtriton_cli.UsageError` (exit status 2, one line on stderr)."""
    main = sys.modules.get("__main__")
    if str(getattr(main, "__file__", "")).endswith("drtriton_cli.py"):
        return main.UsageError(message)  # type: ignore[union-attr]
    from drtriton_cli import UsageError

    return UsageError(message)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or an unusable environment, not a bug."""
    from learner.model.io import ModelFormatError
    from learner.train.checkpoint import CheckpointError
    from learner.train.config import ConfigError
    from learner.train.data import DataError
    from learner.train.verify import SandboxUnreachable

    return (ConfigError, CheckpointError, DataError, ModelFormatError, SandboxUnreachable)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is XLA running out of device (or host) memory."""
    import jax

    return isinstance(err, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(err)


def _memory_advice(err: BaseException, cfg: Any, kind: str) -> str:
    """One line for a step that did not fit: what was asked, what to change, what is kept."""
    import jax

    asked = str(err).split("RESOURCE_EXHAUSTED:", 1)[-1].strip().splitlines()[0]
    knobs = (
        "data.batch_size or data.seq_len"
        if kind == "sft"
        else "rl.prompts_per_step, rl.group_size or rl.max_new_tokens"
    )
    return (
        f"drtriton train {kind}: out of memory on {jax.default_backend()} ({asked}). "
        f"Lower {knobs}, raise optim.grad_accum, or set model.remat=true; "
        f"checkpoints already in {cfg.run_dir} are intact and the run resumes from the newest"
    )


def load_cli_config(args: argparse.Namespace) -> Any:
    from learner.train.config import ConfigError, load_config

    overrides = list(args.set or [])
    if args.run_dir:
        overrides.append(f"run_dir={args.run_dir}")
    try:
        return load_config(args.config, overrides)
    except ConfigError as err:
        raise _usage(_one_line(err)) from None


def _sft(args: argparse.Namespace) -> int:
    cfg = load_cli_config(args)
    from learner.train.sft import run_sft

    try:
        summary = run_sft(cfg)
    except _user_errors() as err:
        raise _usage(_one_line(err)) from None
    except Exception as err:
        if not out_of_memory(err):
            raise
        print(_memory_advice(err, cfg, "sft"), file=sys.stderr)
        return 1
    print(f"sft: step {summary['step']} in {cfg.run_dir}")
    return 0


def _rl(args: argparse.Namespace) -> int:
    cfg = load_cli_config(args)
    from learner.rl.trainer import LogprobGapError, SandboxStarvedError, run_rl

    try:
        summary = run_rl(cfg)
    except _user_errors() as err:
        raise _usage(_one_line(err)) from None
    except (LogprobGapError, SandboxStarvedError) as err:
        # The run stopped itself: its objective would have been corrupted. Checkpoints stay.
        print(f"drtriton train rl: stopped: {_one_line(err)}", file=sys.stderr)
        return 1
    except Exception as err:
        if not out_of_memory(err):
            raise
        print(_memory_advice(err, cfg, "rl"), file=sys.stderr)
        return 1
    print(f"rl: step {summary['steps']} at level {summary['level']} in {cfg.run_dir}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from learner.train.plot import PlotError, plot_run

    try:
        path = plot_run(args.run_dir, args.out)
    except PlotError as err:
        raise _usage(_one_line(err)) from None
    print(path)
    return 0


def _config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        metavar="PRESET_OR_FILE",
        help="tiny-cpu, 100m-gpu, 7b-cluster, or a .json/.toml config file",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. optim.lr=1e-3",
    )
    p.add_argument("--run-dir", help="the run directory (same as --set run_dir=...)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `train` to the top-level parser."""
    train = subparsers.add_parser("train", help="train the policy: SFT, RL, learning curves")
    sub = train.add_subparsers(dest="train_command", metavar="ACTION", required=True)

    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning on teacher pairs (resumes a run directory)",
        description="SFT on `drtriton teacher build` pairs. Started on a run directory with "
        "checkpoints, it resumes from the newest one (the config must match).",
    )
    _config_options(p)
    p.set_defaults(handler=_sft)

    p = sub.add_parser("rl", help="curriculum RL (DRPO or GRPO) with rewards from the sandbox")
    _config_options(p)
    p.set_defaults(handler=_rl)

    p = sub.add_parser("plot", help="learning curves of a run as a PNG")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    p.set_defaults(handler=_plot)
