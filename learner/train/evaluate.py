"""Held-out pass@1: sample one completion per held-out problem, judge its code in the sandbox.

Shared by the SFT and RL trainers. Sampling is seeded by (run seed, step), so the same
checkpoint evaluated twice gives the same completions.

    sampler = make_sampler(model, tokenizer, mesh)
    result = heldout_pass_at_1(sampler, client, records, cfg.eval, cfg.sandbox, seed)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from learner import tokenizer as tokenizers
from learner.generate.sampler import Completion, Sampler, SamplingParams
from learner.train.config import EvalConfig, SandboxConfig
from learner.train.data import pad_id
from learner.train.prompts import PromptRecord
from learner.train.verify import PassAt1, pass_at_1


def make_sampler(model: Any, tokenizer: Any, mesh: Any = None) -> Sampler:
    """A sampler stopping at `</triton_code>` or the tokenizer's EOS; reuse it (compiled
    steps are kept) and swap weights with `sampler.set_model(model)`."""
    return Sampler(
        model,
        tokenizer,
        eos_ids=tokenizers.eos_token_ids(tokenizer),
        mesh=mesh,
        pad_id=pad_id(tokenizer),
    )


def sample_completions(
    sampler: Sampler,
    records: Sequence[PromptRecord],
    params: SamplingParams,
    batch: int,
) -> list[Completion]:
    """One completion per record, `batch` prompts per sampler call; row i's randomness
    depends on (params.seed, i) only."""
    out: list[Completion] = []
    for start in range(0, len(records), max(1, batch)):
        chunk = records[start : start + batch]
        prompts = [list(r.prompt_tokens) for r in chunk]
        out += sampler.generate(prompts, params, seeds=range(start, start + len(chunk)))
    return out


def heldout_pass_at_1(
    sampler: Sampler,
    client: Any,
    records: Sequence[PromptRecord],
    eval_cfg: EvalConfig,
    sandbox_cfg: SandboxConfig,
    seed: int,
) -> tuple[PassAt1, list[Completion]]:
    """pass@1 of the sampler's current model on `records` (and the completions)."""
    params = SamplingParams(
        max_new_tokens=eval_cfg.max_new_tokens,
        temperature=eval_cfg.temperature,
        top_p=eval_cfg.top_p,
        seed=seed,
    )
    completions = sample_completions(sampler, records, params, eval_cfg.sample_batch)
    result = pass_at_1(
        client,
        [r.problem_source for r in records],
        [c.text or "" for c in completions],
        trials=sandbox_cfg.trials,
        timing=sandbox_cfg.timing,
        concurrency=sandbox_cfg.concurrency,
    )
    return result, completions
