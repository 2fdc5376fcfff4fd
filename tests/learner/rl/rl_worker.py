"""Runs the RL tests' training in a process of its own (`python -m tests.learner.rl.rl_worker`).

    sft     ROOT STEPS                     short SFT of a tiny model on ROOT/data -> ROOT/sft/model
    rl      ROOT RUN_DIR SERVER [SET ...]  `run_rl` from ROOT/sft/model against a sandbox server
    rlscore ROOT RUN_DIR SERVER SAMPLES [SET ...]
                                           score ROOT/sft/model, `rl`, score RUN_DIR/model

Each prints one JSON line last: the summary, plus which of torch / triton the process had
imported (the learner must have neither). A process of its own, so a test can kill it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

WEAK = "sandbox.allow_weak_isolation=true"

SFT_SETTINGS = (
    "data.seq_len=576",
    "data.batch_size=2",
    "data.heldout_fraction=0.2",
    "model.tokenizer_vocab_size=1024",
    "optim.lr=1e-2",
    "optim.warmup_steps=5",
    "eval.every=0",
    "eval.at_end=false",
    "log.progress=false",
    "log.every=10",
    "checkpoint.every=1000",
)

RL_SETTINGS = (
    "data.heldout_fraction=0.2",
    "model.tokenizer=",
    "rl.levels=1",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "rl.max_new_tokens=200",
    "rl.max_logprob_gap=0.01",
    "rl.eval_every=0",
    "optim.lr=5e-4",
    "optim.warmup_steps=0",
    "optim.weight_decay=0",
    "optim.decay_steps=100000",
    "log.progress=false",
    "sandbox.trials=2",
    "sandbox.timeout_s=120",
)


def imported() -> dict[str, bool]:
    return {name: name in sys.modules for name in ("torch", "triton")}


def sft(root: Path, steps: int) -> dict[str, Any]:
    from learner.train.config import load_config
    from learner.train.sft import run_sft

    overrides = [f"run_dir={root}/sft", f"data.pairs={root}/data/pairs.jsonl"]
    cfg = load_config("tiny-cpu", [*overrides, *SFT_SETTINGS, f"optim.total_steps={steps}"])
    return run_sft(cfg)


def rl(root: Path, run_dir: str, server: str, settings: list[str]) -> dict[str, Any]:
    from learner.rl.trainer import run_rl
    from learner.train.config import load_config

    overrides = [
        f"run_dir={run_dir}",
        f"data.programs={root}/data/programs.jsonl",
        f"model.path={root}/sft/model",
        f"sandbox.servers={server}",
    ]
    return run_rl(load_config("tiny-cpu", [*overrides, *RL_SETTINGS, *settings]))


def score(model_dir: Path, programs: Path, server: str, samples: int) -> dict[str, Any]:
    """Mean correctness of `samples` temperature-1 answers per program (fixed seeds)."""
    from learner.generate.sampler import Sampler, SamplingParams
    from learner.model import io
    from learner.rl.reward_client import RewardClient
    from learner.rl.rewards import RewardConfig
    from learner.rl.rollout import assemble, prompt_width, requests, sample_rollout
    from learner.tokenizer import load_tokenizer
    from learner.train.data import eos_id, pad_id
    from learner.train.prompts import PromptSource
    from sandbox.client import SandboxClient

    model, _ = io.load(model_dir)
    tokenizer = load_tokenizer(model_dir)
    prompts = list(PromptSource.from_programs(programs, tokenizer, split="all"))
    sampler = Sampler(model, tokenizer, eos_ids=[eos_id(tokenizer)], pad_id=pad_id(tokenizer))
    rollout = sample_rollout(
        sampler, prompts, step=0, seed=1234, group_size=samples,
        sampling=SamplingParams(max_new_tokens=200), width=prompt_width(prompts),
        pad_id=pad_id(tokenizer),
    )  # fmt: skip
    with SandboxClient(server, timeout_s=120) as client:
        records, stats = RewardClient(client, trials=2).judge(requests(rollout))
    out = assemble(rollout, records, RewardConfig())
    valid = out.batch.valid
    return {
        "correct": float(out.batch.correct.sum() / max(valid.sum(), 1)),
        "samples": int(valid.size),
        "sandbox_failures": int(stats.sandbox_failures),
    }


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "sft":
        result = sft(Path(args[0]), int(args[1]))
    elif command == "rl":
        result = rl(Path(args[0]), args[1], args[2], args[3:])
    elif command == "rlscore":
        root, run_dir, server, samples = Path(args[0]), Path(args[1]), args[2], int(args[3])
        programs = root / "data" / "programs.jsonl"
        before = score(root / "sft" / "model", programs, server, samples)
        summary = rl(root, str(run_dir), server, args[4:])
        after = score(run_dir / "model", programs, server, samples)
        result = {"before": before, "after": after, "summary": summary}
    else:
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps({"result": result, "imported": imported()}, default=str), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
