"""The sampler: batching, caching, stopping and the sampling filters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as hs

from learner.generate import sampler as S

PROMPTS = [[5, 17, 99, 3, 64, 12, 7], [42], [8, 9, 10, 11], [100, 101, 3]]
NEW = 10
GREEDY = S.SamplingParams(max_new_tokens=NEW, temperature=0.0)


@pytest.fixture(scope="module")
def engine(tiny_model) -> S.Sampler:
    return S.Sampler(tiny_model, prompt_bucket=8)


@pytest.fixture(scope="module")
def batched(engine: S.Sampler) -> list[S.Completion]:
    return engine.generate(PROMPTS, GREEDY)


def test_batched_ragged_greedy_equals_one_by_one(
    engine: S.Sampler, batched: list[S.Completion]
) -> None:
    assert all(len(c.tokens) == NEW and c.finish_reason == "length" for c in batched)
    assert len({tuple(c.tokens) for c in batched}) == len(PROMPTS)  # not a degenerate model
    assert all(len(set(c.tokens)) > 2 for c in batched)
    for prompt, together in zip(PROMPTS, batched, strict=True):
        alone = engine.generate([prompt], GREEDY)[0]
        assert alone.tokens == together.tokens
        np.testing.assert_allclose(alone.logprobs, together.logprobs, atol=1e-5)


def _full_logprobs(state: nnx.State, graphdef: nnx.GraphDef, tokens: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, state)
    logits, _ = model(tokens, jnp.arange(tokens.shape[1])[None])
    return jax.nn.log_softmax(logits[0], axis=-1)


_full_logprobs = jax.jit(_full_logprobs, static_argnums=1)


def test_cached_decoding_equals_full_recomputation(tiny_model, batched: list[S.Completion]) -> None:
    graphdef, state = nnx.split(tiny_model)
    for prompt, completion in zip(PROMPTS, batched, strict=True):
        sequence = prompt + completion.tokens
        padded = np.zeros((1, 24), np.int32)  # one shape for every row: one compile
        padded[0, : len(sequence)] = sequence
        logprobs = np.asarray(_full_logprobs(state, graphdef, jnp.asarray(padded)))
        rows = logprobs[len(prompt) - 1 : len(sequence) - 1]
        assert rows.argmax(-1).tolist() == completion.tokens  # greedy picks agree
        picked = rows[np.arange(NEW), completion.tokens]
        np.testing.assert_allclose(picked, completion.logprobs, atol=1e-5)


def test_eos_and_stop_sequences_end_rows_independently(
    tiny_model, batched: list[S.Completion]
) -> None:
    eos = batched[0].tokens[3]
    pair = batched[2].tokens[4:6]
    engine = S.Sampler(tiny_model, prompt_bucket=8, eos_ids=[eos])
    tokens, logprobs, lengths, reasons = engine.run(PROMPTS, GREEDY, stop_ids=[[], [], [pair], []])
    for row, free in enumerate(batched):
        seq = free.tokens
        ends = {"length": NEW}
        if eos in seq:
            ends["eos"] = seq.index(eos) + 1
        if row == 2:
            ends["stop"] = next(i + 2 for i in range(NEW - 1) if seq[i : i + 2] == pair)
        reason, n = min(ends.items(), key=lambda kv: (kv[1], kv[0] != "stop"))
        assert (lengths[row], S.FINISH_REASONS[reasons[row]]) == (n, reason), row
        assert tokens[row, :n].tolist() == seq[:n]
        assert (tokens[row, n:] == 0).all() and (logprobs[row, n:] == 0).all()
        np.testing.assert_allclose(logprobs[row, :n], free.logprobs[:n], atol=1e-5)
    assert S.FINISH_REASONS[reasons[0]] == "eos" and S.FINISH_REASONS[reasons[2]] == "stop"


def test_sampling_depends_only_on_seed_and_row_seed(engine: S.Sampler) -> None:
    params = S.SamplingParams(max_new_tokens=NEW, temperature=1.0, top_k=20, top_p=0.95, seed=7)
    seeds = [11, 12, 13, 14]
    forward = engine.generate(PROMPTS, params, seeds=seeds)
    backward = engine.generate(PROMPTS[::-1], params, seeds=seeds[::-1])[::-1]
    assert [c.tokens for c in forward] == [c.tokens for c in backward]
    for c in forward:  # every sampled token survived top-k: its log-prob is among the best
        assert all(np.isfinite(c.logprobs))
    again = engine.generate(
        PROMPTS, S.SamplingParams(**{**params.__dict__, "seed": 8}), seeds=seeds
    )
    assert [c.tokens for c in again] != [c.tokens for c in forward]


class _CharTokenizer:
    """Token i is chr(ord('a') + i): enough to test text-level stop handling."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def test_text_stop_found_after_other_tokenisation_is_cut() -> None:
    engine = object.__new__(S.Sampler)
    engine.tokenizer = _CharTokenizer()
    completion = S.Completion(tokens=[0, 3, 4, 5, 6], logprobs=[-1.0] * 5, finish_reason="length")
    engine._finish_text(completion, ["xyz", "def"])
    assert (completion.text, completion.tokens, completion.finish_reason) == (
        "adef",
        [0, 3, 4, 5],
        "stop",
    )
    eos = S.Completion(tokens=[0, 1, 2], logprobs=[-1.0] * 3, finish_reason="eos")
    engine._finish_text(eos, [])
    assert eos.text == "ab"  # the EOS token stays in `tokens` but not in the text


@settings(max_examples=40, deadline=None)
@given(
    logits=hs.lists(
        hs.floats(-4, 4).map(lambda v: round(v, 2)), min_size=8, max_size=8, unique=True
    ),
    top_p=hs.floats(0.05, 1.0),
    top_k=hs.sampled_from([0, 1, 3]),
)
def test_filter_keeps_the_smallest_nucleus(logits: list[float], top_p: float, top_k: int) -> None:
    x = np.asarray(logits, np.float32)
    filtered, ids = S.filter_logits(jnp.asarray(x), top_k, top_p)
    finite = np.isfinite(np.asarray(filtered))
    kept = set((np.arange(len(x)) if ids is None else np.asarray(ids))[finite].tolist())
    pool = np.argsort(-x)[: top_k or len(x)]
    probs = np.exp(x[pool] - x[pool].max())
    probs /= probs.sum()
    mass_before = np.cumsum(probs) - probs
    expected = set(pool[mass_before < top_p].tolist()) if top_p < 1.0 else set(pool.tolist())
    assert int(np.argmax(x)) in kept
    assert kept == expected or np.isclose(mass_before, top_p, atol=1e-5).any()


def test_stop_hits_matches_right_aligned_sequences() -> None:
    table = S.stop_table([[[7, 8]], [[9], [3, 4, 5]], []])
    assert table.shape == (3, 2, 3)
    window = jnp.asarray([[1, 7, 8], [-2, -2, 9], [3, 4, 5]])
    assert S.stop_hits(window, jnp.asarray(table)).tolist() == [True, True, False]
    assert S.stop_hits(jnp.asarray([[-2, -2, 8]]), jnp.asarray(table[:1])).tolist() == [False]


def test_left_pad_rounds_up_to_the_bucket() -> None:
    tokens, starts = S.left_pad([[1, 2, 3], [4]], 4)
    assert tokens.tolist() == [[0, 1, 2, 3], [0, 0, 0, 4]] and starts.tolist() == [1, 3]
    assert S.left_pad([[1] * 5], 4)[0].shape == (1, 8)
