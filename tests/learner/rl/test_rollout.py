"""Rollout assembly: from sampled completions and verdicts to the RLBatch the update reads."""

from __future__ import annotations

import types

import numpy as np
import pytest

from learner.generate.sampler import Completion, SamplingParams
from learner.rl.cache import VerdictCache
from learner.rl.reward_client import RewardClient
from learner.rl.rewards import RewardConfig
from learner.rl.rollout import assemble, requests, sample_rollout, token_arrays
from sandbox.result import VerifyResult

GOOD = "<triton_code>\nimport triton\n\ndef triton_fused_operator(x):\n    return [x]\n"
OTHER = GOOD.replace("[x]", "[x, x]")
FLAKY = GOOD.replace("[x]", "[x + 0]")


def prompt(pid: str, tokens: tuple[int, ...]) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        program_id=pid, problem_source=f"# problem {pid}\n", prompt_tokens=tokens
    )


class FakeSampler:
    """Hands out scripted completions, remembering how it was called."""

    def __init__(self, script: list[tuple[str, list[int], str]]) -> None:
        self.script = script
        self.calls: list[tuple[list[list[int]], SamplingParams, list[int]]] = []

    def generate(self, rows, params, *, seeds):
        self.calls.append((rows, params, seeds))
        return [
            Completion(tokens=toks, logprobs=[-0.1 * (k + 1) for k in range(len(toks))],
                       finish_reason=reason, text=text)
            for text, toks, reason in self.script
        ]  # fmt: skip


class FakeClient:
    """`correct` for GOOD, `wrong_output` for OTHER, `sandbox_error` for FLAKY."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def verify_many(self, items, *, concurrency=32, progress=False):
        self.sent += [item["candidate"] for item in items]
        out = []
        for item in items:
            if "[x + 0]" in item["candidate"]:
                out.append(VerifyResult(verdict="sandbox_error", message="UNAVAILABLE"))
            elif "[x, x]" in item["candidate"]:
                out.append(VerifyResult(verdict="wrong_output"))
            else:
                out.append(VerifyResult(verdict="correct", speedup_vs_eager=2.0))
        return out


SCRIPT = [
    # prompt a: correct, no code block (unparsable), cut at the length limit, wrong
    (GOOD, [5, 6, 7], "stop"),
    ("I think the answer is", [8, 9], "eos"),
    (GOOD[:40], [5, 6, 7, 8, 9, 10], "length"),
    (OTHER, [4], "stop"),
    # prompt b: sandbox failure, correct, the same correct kernel again (judged once)
    (FLAKY, [4, 4], "stop"),
    (GOOD, [5, 6, 7, 3], "eos"),
    (GOOD, [5, 6, 7, 3], "eos"),
    (OTHER, [4], "stop"),
]


def test_rollout_assembles_masks_validity_and_counts() -> None:
    prompts = [prompt("a", (1, 2, 3)), prompt("b", (1,))]
    sampler = FakeSampler(SCRIPT)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    rollout = sample_rollout(
        sampler, prompts, step=7, seed=1234, group_size=4, sampling=sampling, width=4, pad_id=0
    )
    rows, params, seeds = sampler.calls[0]
    assert rows == [[1, 2, 3]] * 4 + [[1]] * 4, "prompt-major, G copies of each prompt"
    assert params.seed == 1234 and seeds == list(range(8))

    # Token layout: prompt left-padded to width 4, completion from column 4.
    assert rollout.tokens.shape == (8, 10)
    assert rollout.tokens[0].tolist() == [0, 1, 2, 3, 5, 6, 7, 0, 0, 0]
    assert rollout.tokens[4].tolist() == [0, 0, 0, 1, 4, 4, 0, 0, 0, 0]
    assert rollout.starts.tolist() == [1] * 4 + [3] * 4
    assert rollout.mask.sum(axis=-1).tolist() == [[3, 2, 6, 1], [2, 4, 4, 1]]
    np.testing.assert_allclose(rollout.old_logp[0, 0, :4], [-0.1, -0.2, -0.3, 0.0])

    client = FakeClient()
    reward = RewardClient(client, cache=VerdictCache(16))
    records, stats = reward.judge(requests(rollout))
    assert (stats.rejected, stats.cached, stats.sent, stats.sandbox_failures) == (2, 1, 5, 1)
    assert len(client.sent) == 5, "unparsable, truncated and repeated answers are not sent"

    out = assemble(rollout, records, RewardConfig("log"))
    batch = out.batch
    assert batch.valid.tolist() == [[True, True, False, True], [False, True, True, True]]
    assert batch.correct.tolist() == [[True, False, False, False], [False, True, True, False]]
    np.testing.assert_allclose(batch.speed_reward[0, 0], np.log(2.0), rtol=1e-6)
    assert batch.speed_reward[0, 1] == 0.0, "wrong samples carry r_s of speedup 1"
    counts = out.counts
    assert counts["unparsable"] == 1 and counts["truncated"] == 1
    assert counts["sandbox_failures"] == 1 and counts["cached"] == 1
    assert counts["mixed_groups"] == 2 and counts["completion_tokens"] == 23
    assert out.speedups.tolist() == [2.0, 2.0, 2.0]


def test_one_sided_groups_are_counted() -> None:
    script = [(GOOD, [5], "stop")] * 2 + [(OTHER, [4], "stop")] * 2
    rollout = sample_rollout(
        FakeSampler(script), [prompt("a", (1,)), prompt("b", (2,))], step=0, seed=0,
        group_size=2, sampling=SamplingParams(max_new_tokens=2), width=2, pad_id=0,
    )  # fmt: skip
    records, _ = RewardClient(FakeClient()).judge(requests(rollout))
    counts = assemble(rollout, records, RewardConfig("power", 0.5)).counts
    assert (counts["all_correct_groups"], counts["all_wrong_groups"]) == (1, 1)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="longer than the width"):
        token_arrays([[1, 2, 3]], [[4]], width=2, max_new=2, pad_id=0)
    with pytest.raises(ValueError, match="exceeds"):
        token_arrays([[1]], [[4, 5, 6]], width=2, max_new=2, pad_id=0)
    rollout = sample_rollout(
        FakeSampler([(GOOD, [5], "stop")]), [prompt("a", (1,))], step=0, seed=0, group_size=1,
        sampling=SamplingParams(max_new_tokens=2), width=2, pad_id=0,
    )  # fmt: skip
    with pytest.raises(ValueError, match="verdicts for"):
        assemble(rollout, [], RewardConfig())
