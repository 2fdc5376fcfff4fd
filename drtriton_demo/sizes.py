"""How big each stage of the demo is, as data: `smoke` (tests), `cpu` (a toy), `gpu`.

A size names the training preset and the few numbers that set the demo's cost: programs per
level, training steps, search problems, evaluation problems. Everything else is the
presets' own (learner/train/presets.py, learner/rl/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# Operators whose teacher kernels are short: the toy sizes train on these only.
SHORT_KERNEL_OPS = ("relu", "add", "softmax", "sum", "matmul", "layer_norm", "gelu", "max_pool2d")


@dataclass(frozen=True)
class DemoSize:
    """One size of the demo (see the module docstring)."""

    name: str
    preset: str  # the `drtriton train --config` preset
    train_programs: tuple[tuple[int, int], ...]  # (level, count): the teacher's programs
    train_ops: tuple[str, ...] | None  # operators of the training programs (None = all)
    train_profile: str  # shapes of the training programs (`drtriton synth generate --profile`)
    profile: str  # shapes of the search and evaluation programs
    teacher_trials: int
    sft_steps: int
    sft_set: tuple[str, ...]  # extra `--set` values of `drtriton train sft`
    rl_steps: int
    rl_levels: tuple[int, ...]
    rl_set: tuple[str, ...]  # extra `--set` values of `drtriton train rl`
    search_programs: tuple[tuple[int, int], ...]  # (level, count): problems for search
    search_samples: int
    eval_levels: tuple[int, ...]
    eval_count: int  # synthetic problems per evaluation level
    timing: bool  # time kernels (a GPU sandbox); off on CPU, where nothing is timed
    workers: int  # graders of the demo's sandbox server
    toy: bool  # what the report says of the trained policy
    estimate: str  # how long it takes, for the first line the demo prints

    def __post_init__(self) -> None:
        counts = [n for _, n in self.train_programs]
        if not counts or min(counts) < 0 or sum(counts) < 1:
            raise ValueError(f"size {self.name}: it needs at least one training program")
        if self.sft_steps < 1 or self.rl_steps < 1:
            raise ValueError(f"size {self.name}: SFT and RL need at least one step each")
        if self.eval_count < 1 or not self.eval_levels:
            raise ValueError(f"size {self.name}: evaluation needs levels and problems")


# Teacher completions run to ~2,000 tokens of the 1,024-entry BPE: rows and sampling budgets
# are sized for them (the presets' 512 would drop every pair and truncate every answer).
_CPU_ROWS = ("data.seq_len=2048", "log.progress=false")

SIZES: dict[str, DemoSize] = {
    # The smallest loop that still runs every stage: what the slow test runs.
    "smoke": DemoSize(
        name="smoke",
        preset="tiny-cpu",
        train_programs=((1, 4),),
        train_ops=("relu", "softmax", "max_pool2d", "gelu"),
        train_profile="tiny",
        profile="tiny",
        teacher_trials=1,
        sft_steps=2,
        sft_set=(
            *_CPU_ROWS,
            "data.batch_size=2",
            "optim.warmup_steps=1",
            "eval.pass_at_1_problems=0",
        ),
        rl_steps=1,
        rl_levels=(1,),
        rl_set=(*_CPU_ROWS, "rl.prompts_per_step=2", "rl.group_size=2", "rl.max_new_tokens=32"),
        search_programs=((2, 1),),
        search_samples=1,
        eval_levels=(1,),
        eval_count=1,
        timing=False,
        workers=2,
        toy=True,
        estimate="1-2 minutes on 2 CPU cores",
    ),
    # A toy on a 2-core CPU: a 2-layer model, a few dozen SFT steps, three DRPO steps.
    "cpu": DemoSize(
        name="cpu",
        preset="tiny-cpu",
        train_programs=((1, 16), (2, 8)),
        train_ops=SHORT_KERNEL_OPS,
        train_profile="tiny",
        profile="tiny",
        teacher_trials=2,
        sft_steps=40,
        sft_set=(
            *_CPU_ROWS,
            "data.batch_size=2",
            "optim.warmup_steps=5",
            "eval.pass_at_1_problems=2",
            "eval.max_new_tokens=1024",
            "eval.sample_batch=2",
        ),
        rl_steps=3,
        rl_levels=(1,),
        rl_set=(*_CPU_ROWS, "rl.max_new_tokens=1536"),
        search_programs=((2, 1), (3, 1)),
        search_samples=2,
        eval_levels=(1, 2),
        eval_count=3,
        timing=False,
        workers=2,
        toy=True,
        estimate="about 4 minutes on 2 CPU cores",
    ),
    # One GPU: the ~100M preset for a few hundred SFT steps and a few timed DRPO steps.
    # Training programs keep tiny shapes (pairs are judged for correctness only; timing a
    # paper-size program with its torch.compile baseline takes seconds); search and
    # evaluation use paper-size shapes, where speedups mean something.
    "gpu": DemoSize(
        name="gpu",
        preset="100m-gpu",
        train_programs=((1, 256), (2, 64)),
        train_ops=None,
        train_profile="tiny",
        profile="paper",
        teacher_trials=3,
        sft_steps=200,
        sft_set=(
            "optim.warmup_steps=30",
            "eval.pass_at_1_problems=32",
            "log.progress=false",
        ),
        rl_steps=5,
        rl_levels=(1,),  # a few steps never reach a promotion: level 1 only
        rl_set=("log.progress=false", "sandbox.timing=true"),
        search_programs=((2, 2), (3, 2)),
        search_samples=4,
        eval_levels=(1, 2, 5),
        eval_count=8,
        timing=True,
        workers=8,
        toy=False,
        estimate="about 15-20 minutes on one H100 (not yet measured)",
    ),
}

SIZE_NAMES = tuple(SIZES)


def size_for(name: str, device: str) -> DemoSize:
    """The size `name` names; "auto" is `gpu` on a CUDA device and `cpu` otherwise."""
    if name == "auto":
        name = "gpu" if device == "cuda" else "cpu"
    if name not in SIZES:
        raise ValueError(f"unknown size {name!r}: one of auto, {', '.join(SIZE_NAMES)}")
    return SIZES[name]
