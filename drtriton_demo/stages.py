"""The demo's stages as data: which `drtriton` commands each runs and what it writes.

`plan(size, paths, seed)` is a pure function: the same size, directory and seed give the
same commands, so a finished stage can be recognised on a later run by its commands alone.
Commands name the sandbox server as `{server}` (and the GPU gate as `{gpu_gate}`): both are
known only once the demo's server is up, and differ from run to run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from drtriton_demo.sizes import DemoSize

SERVER = "{server}"
GPU_GATE = "{gpu_gate}"
TEACHER = "teacher"
TRAINED = "trained"
STAGE_NAMES = ("programs", "pairs", "sft", "rl", "search", "eval")


@dataclass(frozen=True)
class Command:
    """One `drtriton ARGS...` run; `ok` are the exit statuses that are not failures."""

    args: tuple[str, ...]
    ok: tuple[int, ...] = (0,)

    def filled(self, values: dict[str, str]) -> list[str]:
        """The arguments with `{server}` / `{gpu_gate}` replaced by their values."""
        out = []
        for arg in self.args:
            for name, value in values.items():
                arg = arg.replace("{" + name + "}", value)
            out.append(arg)
        return out


@dataclass(frozen=True)
class Stage:
    """A step of the loop: commands run in order, the paths they write (removed before the
    stage runs again from scratch), and whether they need the sandbox server."""

    name: str
    title: str
    commands: tuple[Command, ...]
    outputs: tuple[Path, ...]
    needs_server: bool

    def key(self, size: DemoSize) -> str:
        """A digest of what the stage does: equal keys mean an earlier run did the same."""
        text = json.dumps([size.name, [[list(c.args), list(c.ok)] for c in self.commands]])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DemoPaths:
    """Where everything lives under the demo's output directory."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "demo.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def programs(self) -> Path:
        return self.root / "programs"

    @property
    def problems(self) -> Path:
        return self.programs / "search"

    @property
    def pairs(self) -> Path:
        return self.root / "pairs"

    @property
    def sft(self) -> Path:
        return self.root / "sft"

    @property
    def rl(self) -> Path:
        return self.root / "rl"

    @property
    def trained_model(self) -> Path:
        return self.rl / "model"

    @property
    def search(self) -> Path:
        return self.root / "search"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def report(self) -> Path:
        return self.root / "REPORT.md"

    @property
    def curve(self) -> Path:
        return self.root / "speedup_curve.png"

    def train_programs(self, level: int) -> Path:
        return self.programs / f"train_l{level}.jsonl"

    def search_programs(self, level: int) -> Path:
        return self.programs / f"search_l{level}.jsonl"

    def pairs_file(self, level: int) -> Path:
        return self.pairs / f"pairs_l{level}.jsonl"

    def problem_file(self, level: int, index: int) -> Path:
        return self.problems / f"l{level}-{index}.py"

    def policy_spec(self, policy: str) -> str:
        return TEACHER if policy == TEACHER else f"checkpoint:{self.trained_model}"


def _levels(programs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(level, count) for level, count in programs if count > 0]


def _programs(size: DemoSize, paths: DemoPaths, seed: int) -> Stage:
    commands = []
    for level, count in _levels(size.train_programs):
        ops = ("--ops", ",".join(size.train_ops)) if size.train_ops else ()
        out = paths.train_programs(level)
        commands.append(_generate(level, count, seed, size.train_profile, out, ops))
    for level, count in _levels(size.search_programs):
        out = paths.search_programs(level)
        commands.append(_generate(level, count, seed + 1, size.profile, out, ()))
    return Stage(
        "programs",
        "random PyTorch programs (drtriton synth generate)",
        tuple(commands),
        (paths.programs,),
        needs_server=False,
    )


def _generate(
    level: int, count: int, seed: int, profile: str, out: Path, ops: tuple[str, ...]
) -> Command:
    return Command(
        (
            *("synth", "generate", "--level", str(level), "--count", str(count)),
            *("--seed", str(seed), "--profile", profile, *ops, "--out", str(out), "--quiet"),
        )
    )


def _timing(size: DemoSize) -> tuple[str, ...]:
    return () if size.timing else ("--no-timing",)


def _pairs(size: DemoSize, paths: DemoPaths) -> Stage:
    """Pairs are judged for correctness only: SFT needs no speedups, and timing each program
    against torch.compile would cost seconds apiece on a GPU."""
    commands = []
    for level, _ in _levels(size.train_programs):
        commands.append(
            Command(
                (
                    *("teacher", "build", "--programs", str(paths.train_programs(level))),
                    *("--out", str(paths.pairs_file(level)), "--server", SERVER),
                    *("--trials", str(size.teacher_trials), "--no-timing", "--no-progress"),
                ),
                ok=(0, 1),  # 1: no pair of this level verified (another level may have some)
            )
        )
    return Stage(
        "pairs",
        "teacher kernels, verified by the sandbox (drtriton teacher build)",
        tuple(commands),
        (paths.pairs,),
        needs_server=True,
    )


def _steps(count: int) -> str:
    return f"{count} step" + ("" if count == 1 else "s")


def _sets(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(arg for value in values for arg in ("--set", value))


def _sft(size: DemoSize, paths: DemoPaths) -> Stage:
    pairs = ",".join(str(paths.pairs_file(level)) for level, _ in _levels(size.train_programs))
    values = (
        f"data.pairs={pairs}",
        f"optim.total_steps={size.sft_steps}",
        f"checkpoint.every={max(1, size.sft_steps // 4)}",  # a cut run resumes near where it was
        "eval.every=0",
        f"sandbox.servers={SERVER}",
        *size.sft_set,
    )
    args = ("train", "sft", "--config", size.preset, "--run-dir", str(paths.sft), *_sets(values))
    return Stage(
        "sft",
        f"supervised fine-tuning, {size.preset}, {_steps(size.sft_steps)} (drtriton train sft)",
        (Command(args),),
        (paths.sft,),
        needs_server=True,
    )


def _rl(size: DemoSize, paths: DemoPaths) -> Stage:
    programs = ",".join(
        str(paths.train_programs(level)) for level, _ in _levels(size.train_programs)
    )
    values = (
        f"model.path={paths.sft / 'model'}",
        f"data.programs={programs}",
        f"rl.max_steps={size.rl_steps}",
        f"rl.levels={','.join(str(level) for level in size.rl_levels)}",
        "rl.eval_every=0",
        f"checkpoint.every={size.rl_steps}",
        f"sandbox.servers={SERVER}",
        f"rl.gpu_gate_dir={GPU_GATE}",
        "log.every=1",
        *size.rl_set,
    )
    args = ("train", "rl", "--config", size.preset, "--run-dir", str(paths.rl), *_sets(values))
    return Stage(
        "rl",
        f"DRPO against the sandbox, {_steps(size.rl_steps)} (drtriton train rl)",
        (Command(args),),
        (paths.rl,),
        needs_server=True,
    )


def search_problems(size: DemoSize, paths: DemoPaths) -> list[Path]:
    """The problem files the search stage reads (written after the programs stage)."""
    return [
        paths.problem_file(level, index)
        for level, count in _levels(size.search_programs)
        for index in range(count)
    ]


def search_outcome(paths: DemoPaths, policy: str, problem: Path) -> Path:
    return paths.search / policy / f"{problem.stem}.json"


def _search(size: DemoSize, paths: DemoPaths) -> Stage:
    commands = []
    for policy in (TEACHER, TRAINED):
        for problem in search_problems(size, paths):
            out = search_outcome(paths, policy, problem)
            args = (
                *("search", str(problem), "--policy", paths.policy_spec(policy)),
                *("--server", SERVER, "--samples", str(size.search_samples), *_timing(size)),
                *("--out", str(out), "--write-candidate", str(out.with_suffix(".candidate.py"))),
            )
            commands.append(Command(args, ok=(0, 1)))  # 1: no correct answer found
    return Stage(
        "search",
        "test-time search, teacher and trained policy (drtriton search)",
        tuple(commands),
        (paths.search,),
        needs_server=True,
    )


def _eval(size: DemoSize, paths: DemoPaths) -> Stage:
    commands = []
    for policy in (TEACHER, TRAINED):
        args = (
            *("eval", "--suite", "synthetic", "--profile", size.profile),
            *("--levels", ",".join(str(level) for level in size.eval_levels)),
            *("--count", str(size.eval_count), "--policy", paths.policy_spec(policy)),
            *("--out", str(paths.eval / policy), "--server", SERVER, *_timing(size)),
            *("--resume", "--no-progress"),
        )
        commands.append(Command(args))
    return Stage(
        "eval",
        "evaluation on a synthetic suite, teacher and trained policy (drtriton eval)",
        tuple(commands),
        (paths.eval,),
        needs_server=True,
    )


def plan(size: DemoSize, paths: DemoPaths, seed: int = 0) -> list[Stage]:
    """Every stage of the loop, in order (names in `STAGE_NAMES`)."""
    stages = [
        _programs(size, paths, seed),
        _pairs(size, paths),
        _sft(size, paths),
        _rl(size, paths),
        _search(size, paths),
        _eval(size, paths),
    ]
    assert tuple(s.name for s in stages) == STAGE_NAMES
    return stages
