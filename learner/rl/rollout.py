"""One RL step's rollouts: B prompts x G samples, their code, and the arrays the update reads.

`sample_rollout` draws the samples (the sampler returns each token's log-probability under
the policy that drew it: the behaviour log-probs); `requests` turns the completions into
sandbox requests (code extracted from the `<triton_code>` block, or None); `assemble`
turns the verdicts into an `RLBatch` plus the token arrays the update recomputes log-probs
on. All randomness of a step comes from (run seed, step), so a step re-made after a resume
draws exactly the samples it drew before.

Layout of the token arrays (N = B·G rows, prompt-major: row b·G + g is sample g of prompt b):
each prompt is left-padded to a fixed width W and its completion follows at slots
W .. W+T-1 (T = max new tokens), padded after its end. The completion's tokens are then
at the same columns in every row, so [N, T] log-probs come out of one slice.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from learner.rl.common import RLBatch
from learner.rl.reward_client import Request
from learner.rl.rewards import RewardConfig, verdict_arrays
from synth.teacher.prompt import extract_code


@dataclasses.dataclass
class Rollout:
    """What sampling one step produced (everything but the verdicts)."""

    step: int
    prompts: list[Any]  # B PromptRecords (program_id, problem_source, prompt_tokens, ...)
    group_size: int
    texts: list[str]  # N completion texts
    finish_reasons: list[str]  # N
    tokens: np.ndarray  # [N, W+T] int32
    starts: np.ndarray  # [N] int32: each row's first prompt slot
    old_logp: np.ndarray  # [B, G, T] float32
    mask: np.ndarray  # [B, G, T] bool: completion tokens
    prompt_width: int
    sample_seconds: float = 0.0
    # The parameters that drew the samples (an nnx.State) and how many updates they had.
    behaviour: Any = None
    params_step: int = 0

    @property
    def truncated(self) -> np.ndarray:
        """[B, G]: completions cut at the length limit."""
        flat = np.array([r == "length" for r in self.finish_reasons], dtype=bool)
        return flat.reshape(len(self.prompts), self.group_size)

    @property
    def codes(self) -> list[str | None]:
        return [extract_code(text) for text in self.texts]

    @property
    def completion_tokens(self) -> int:
        return int(self.mask.sum())


def prompt_width(prompts: Sequence[Any], bucket: int = 64) -> int:
    """W: the longest prompt rounded up to `bucket` (fix it per prompt set: one compile)."""
    longest = max(len(p.prompt_tokens) for p in prompts)
    return max(bucket, -(-longest // bucket) * bucket)


def token_arrays(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    width: int,
    max_new: int,
    pad_id: int,
) -> tuple[np.ndarray, np.ndarray]:
    """[N, width + max_new] tokens (prompt left-padded to `width`, completion after) and starts."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
    tokens = np.full((len(prompts), width + max_new), pad_id, dtype=np.int32)
    starts = np.zeros(len(prompts), dtype=np.int32)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        if len(prompt) > width:
            raise ValueError(f"prompt of {len(prompt)} tokens is longer than the width {width}")
        if len(completion) > max_new:
            raise ValueError(f"completion of {len(completion)} tokens exceeds {max_new}")
        starts[row] = width - len(prompt)
        tokens[row, starts[row] : width] = prompt
        tokens[row, width : width + len(completion)] = completion
    return tokens, starts


def sample_rollout(
    sampler: Any,
    prompts: Sequence[Any],
    *,
    step: int,
    seed: int,
    group_size: int,
    sampling: Any,
    width: int,
    pad_id: int,
) -> Rollout:
    """Draw G completions for each of the B prompts with `sampler` (a `Sampler`).

    `sampling` is a `SamplingParams` whose seed is replaced by `seed` (derived from the run
    seed and the step); row r gets row seed r, so every sample is a pure function of
    (run seed, step, row) and the parameters.
    """
    started = time.perf_counter()
    rows = [list(p.prompt_tokens) for p in prompts for _ in range(group_size)]
    params = dataclasses.replace(sampling, seed=seed)
    completions = sampler.generate(rows, params, seeds=list(range(len(rows))))
    max_new = params.max_new_tokens
    tokens, starts = token_arrays(rows, [c.tokens for c in completions], width, max_new, pad_id)
    n = len(rows)
    old_logp = np.zeros((n, max_new), dtype=np.float32)
    mask = np.zeros((n, max_new), dtype=bool)
    for row, completion in enumerate(completions):
        length = len(completion.tokens)
        old_logp[row, :length] = completion.logprobs
        mask[row, :length] = True
    shape = (len(prompts), group_size, max_new)
    return Rollout(
        step=step,
        prompts=list(prompts),
        group_size=group_size,
        texts=[c.text or "" for c in completions],
        finish_reasons=[c.finish_reason for c in completions],
        tokens=tokens,
        starts=starts,
        old_logp=old_logp.reshape(shape),
        mask=mask.reshape(shape),
        prompt_width=width,
        sample_seconds=time.perf_counter() - started,
    )


def requests(rollout: Rollout) -> list[Request]:
    """The sandbox requests of a rollout, row order. Truncated completions are not sent
    (they are masked whatever the verdict): their code is None, i.e. rejected unsent."""
    out = []
    truncated = rollout.truncated.ravel()
    for row, code in enumerate(rollout.codes):
        prompt = rollout.prompts[row // rollout.group_size]
        out.append(
            Request(prompt.program_id, prompt.problem_source, None if truncated[row] else code)
        )
    return out


@dataclasses.dataclass
class Assembled:
    """An update's inputs (host arrays) and what the step's samples came to."""

    batch: RLBatch  # numpy arrays, [B, G, T] / [B, G]
    tokens: np.ndarray  # [N, W+T]
    starts: np.ndarray  # [N]
    counts: dict[str, float]
    speedups: np.ndarray  # speedups of the correct, timed samples


def assemble(
    rollout: Rollout, records: Sequence[Mapping[str, Any]], reward: RewardConfig
) -> Assembled:
    """Verdict records (one per row) + the rollout -> the update's batch and the step's counts.

    Truncated completions are invalid (masked) whatever their record says; sandbox failures
    are invalid; a rejected (unparsable) completion is a valid wrong answer.
    """
    truncated = rollout.truncated.ravel()
    if len(records) != len(truncated):
        raise ValueError(f"{len(records)} verdicts for {len(truncated)} samples")
    full = [
        {**record, "truncated": bool(cut)} for record, cut in zip(records, truncated, strict=True)
    ]
    arrays = verdict_arrays(full, rollout.group_size)
    batch = RLBatch(
        old_logp=rollout.old_logp,
        mask=rollout.mask,
        valid=arrays.valid,
        correct=arrays.correct,
        speed_reward=reward.speed_reward(arrays.speedup),
    )
    sources = [r.get("source", "sandbox") for r in records]
    unparsable = sum(
        1 for s, cut in zip(sources, truncated, strict=True) if s == "rejected" and not cut
    )
    timed = [
        float(r["speedup_vs_eager"])
        for r, ok in zip(records, arrays.correct.ravel(), strict=True)
        if ok and r.get("speedup_vs_eager") is not None
    ]
    counts: dict[str, float] = {
        **arrays.counts,
        "unparsable": unparsable,
        "cached": sources.count("cache"),
        "sent": sources.count("sandbox"),
        "completion_tokens": rollout.completion_tokens,
    }
    return Assembled(batch, rollout.tokens, rollout.starts, counts, np.asarray(timed, np.float64))
