"""A greedy step's bookkeeping as two Pallas kernels (Triton's interpreter off the GPU) equals
the sampler's XLA loop: the same tokens, log-probabilities, lengths and finish reasons."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.pallas.triton import lowering as triton_lowering

from learner.generate import greedy_kernels as G
from learner.generate import sampler as S
from learner.model import qwen2

from ..conftest import random_tiny_model

VOCAB = 100  # not a multiple of the blocks below: the last block is ragged


def _state(rows: int, steps: int, stop_len: int, **overrides: jax.Array) -> G.GreedyState:
    i32 = jnp.int32
    fresh = G.GreedyState(
        step=jnp.zeros(1, i32),
        tokens=jnp.full((rows, steps), 0, i32),
        logprobs=jnp.zeros((rows, steps), jnp.float32),
        lengths=jnp.zeros(rows, i32),
        done=jnp.zeros(rows, i32),
        reason=jnp.zeros(rows, i32),
        window=jnp.full((rows, stop_len), -2, i32),
    )
    return fresh._replace(**overrides)


def _logits(rows: int) -> jax.Array:
    logits = jax.random.normal(jax.random.key(0), (rows, VOCAB)) * 4
    logits = logits.at[1, 3].set(30.0).at[1, 90].set(30.0)  # a tie across blocks: the first wins
    return logits.at[2, ::2].set(-jnp.inf)


@pytest.mark.parametrize("block_v", [16, 128])
def test_partials_merge_to_the_argmax_and_its_log_probability(block_v: int) -> None:
    logits = _logits(3)
    embedding = jax.random.normal(jax.random.key(1), (VOCAB, 24), jnp.bfloat16)
    partials = G.logit_partials(logits, block_v=block_v)
    assert partials[0].shape == (3, -(-VOCAB // block_v))
    state, nxt = G.greedy_update(
        partials, _state(3, 4, 1), jnp.asarray([5, 1, 3]), embedding,
        jnp.zeros(0, jnp.int32), jnp.full((3, 0, 1), -1, jnp.int32),
        vocab=VOCAB, width=8, max_new=4, pad_id=0,
    )  # fmt: skip
    want = jnp.argmax(logits, axis=-1)
    np.testing.assert_array_equal(state.tokens[:, 0], want)
    assert int(state.tokens[1, 0]) == 3
    want_logprob = jnp.max(logits, axis=-1) - jax.nn.logsumexp(logits, axis=-1)
    np.testing.assert_allclose(state.logprobs[:, 0], want_logprob, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state.tokens[:, 1:], 0)  # only this step's column
    np.testing.assert_array_equal(nxt.rows, embedding[want])
    np.testing.assert_array_equal(nxt.positions, [5, 1, 3])  # prompt lengths + step 0
    assert nxt.index.tolist() == [8] and state.step.tolist() == [1]
    np.testing.assert_array_equal(state.lengths, [1, 1, 1])
    np.testing.assert_array_equal(state.window[:, -1], want)


def test_done_rows_record_pad_and_keep_their_reason_while_others_finish() -> None:
    """Row 0 finished earlier (eos); row 1 hits its stop sequence now, row 2 an eos id; at
    step 3 of max_new 4 every row is done after this step."""
    logits = _logits(3)
    picked = [int(t) for t in jnp.argmax(logits, axis=-1)]
    window = jnp.asarray([[7, 7], [-2, 11], [-2, -2]], jnp.int32)
    stops = jnp.asarray(
        [[[-1, -1], [-1, -1]], [[11, picked[1]], [-1, 4]], [[-1, 55], [-1, -1]]], jnp.int32
    )
    state = _state(
        3, 5, 2,
        step=jnp.asarray([2], jnp.int32),
        lengths=jnp.asarray([1, 2, 2], jnp.int32),
        done=jnp.asarray([1, 0, 0], jnp.int32),
        reason=jnp.asarray([1, 0, 0], jnp.int32),
        window=window,
    )  # fmt: skip
    embedding = jnp.arange(VOCAB * 8, dtype=jnp.float32).reshape(VOCAB, 8)
    eos = jnp.asarray([picked[2], 99], jnp.int32)
    new, nxt = G.greedy_update(
        G.logit_partials(logits, block_v=32), state, jnp.asarray([4, 4, 4]), embedding, eos,
        stops, vocab=VOCAB, width=6, max_new=4, pad_id=9,
    )  # fmt: skip
    assert new.tokens[:, 2].tolist() == [9, picked[1], picked[2]]
    assert float(new.logprobs[0, 2]) == 0.0 and float(new.logprobs[1, 2]) < 0
    assert new.lengths.tolist() == [1, 3, 3]
    assert new.reason.tolist() == [1, 2, 1]
    assert new.done.tolist() == [1, 1, 1]
    assert new.window.tolist() == [[7, 9], [11, picked[1]], [-2, picked[2]]]
    np.testing.assert_array_equal(nxt.rows, embedding[jnp.asarray([9, picked[1], picked[2]])])
    assert nxt.positions.tolist() == [6, 6, 6] and nxt.index.tolist() == [8]
    assert new.step.tolist() == [3]


def test_a_row_not_yet_at_max_new_and_without_hits_stays_open() -> None:
    logits = _logits(1)
    new, _ = G.greedy_update(
        G.logit_partials(logits), _state(1, 8, 1), jnp.asarray([2]),
        jnp.zeros((VOCAB, 4)), jnp.asarray([-5], jnp.int32), jnp.full((1, 1, 1), -1, jnp.int32),
        vocab=VOCAB, width=2, max_new=8, pad_id=0,
    )  # fmt: skip
    assert new.done.tolist() == [0] and new.reason.tolist() == [0]


def test_mismatched_window_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="window"):
        G.greedy_update(
            G.logit_partials(_logits(1)), _state(1, 2, 3), jnp.asarray([1]), jnp.zeros((VOCAB, 4)),
            jnp.zeros(0, jnp.int32), jnp.full((1, 0, 2), -1, jnp.int32),
            vocab=VOCAB, width=1, max_new=2, pad_id=0,
        )  # fmt: skip


def test_sampler_greedy_pallas_loop_finishes_rows_as_the_xla_loop_does() -> None:
    """A whole greedy decode with an eos id and per-row stop sequences, both loops: rows end
    by eos, by stop sequence and by length at the same tokens, with the same log-probs."""
    model = random_tiny_model(tied=True, seed=5)
    prompts = [[5, 17, 99, 3, 64, 12, 7], [42], [8, 9, 10, 11]]
    params = S.SamplingParams(max_new_tokens=7, temperature=0.0)
    free = S.Sampler(model, prompt_bucket=8, chunk=4, decode_kernels="xla").run(prompts, params)
    tokens = free[0]
    eos, stop = int(tokens[0, 2]), [int(tokens[1, 3]), int(tokens[1, 4])]
    assert eos not in tokens[0, :2] and eos not in tokens[1, :5]  # row 0 ends at its third
    stop_ids = [[], [stop], [[12345]]]
    runs = {
        kernels: S.Sampler(
            model, eos_ids=[eos], prompt_bucket=8, chunk=4, decode_kernels=kernels
        ).run(prompts, params, stop_ids)
        for kernels in ("xla", "pallas")
    }
    (x_tok, x_lp, x_len, x_why), (p_tok, p_lp, p_len, p_why) = runs["xla"], runs["pallas"]
    assert x_len[0] == 3 and x_why[0] == 1 and x_len[1] == 5 and x_why[1] == 2
    np.testing.assert_array_equal(p_tok, x_tok)
    np.testing.assert_array_equal(p_len, x_len)
    np.testing.assert_array_equal(p_why, x_why)
    np.testing.assert_allclose(p_lp, x_lp, atol=1e-5)


def test_the_greedy_pallas_loop_runs_only_where_the_pallas_layers_do() -> None:
    """Sampling (temperature > 0) and the XLA kernels keep the XLA bookkeeping: the decode's
    jaxpr holds the greedy kernels only for a greedy decode on the Pallas path."""
    model = random_tiny_model(tied=True, seed=5)

    def kernel_names(kernels: str, temperature: float) -> str:
        sampler = S.Sampler(model, prompt_bucket=8, chunk=2, decode_kernels=kernels)
        graphdef, state = sampler.graphdef, sampler.state
        cache = qwen2.init_cache(model.config, 1, 10, jnp.float32)
        args = (
            graphdef, state, cache, jnp.zeros((1, model.config.vocab_size)),
            jnp.zeros(1, jnp.int32), jnp.zeros(1, jnp.uint32), jnp.full((1, 0, 1), -1, jnp.int32),
            jnp.zeros(0, jnp.int32), jnp.uint32(0),
        )  # fmt: skip
        options = dict(max_new=2, temperature=temperature, top_k=0, top_p=1.0, pad_id=0, chunk=2)
        return str(S.decode.trace(*args, kernels=kernels, **options).jaxpr)

    assert "greedy_update" in kernel_names("pallas", 0.0)
    assert "greedy_update" not in kernel_names("pallas", 1.0)
    assert "greedy_update" not in kernel_names("xla", 0.0)


def test_a_greedy_step_at_batch_one_lowers_to_kernels_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Qwen2.5-0.5B's greedy decode lowered for a CUDA GPU: each step is the two greedy kernels
    plus the layers' and the final norm's, and XLA is left the output head's matmul and
    the loop's own counters, no lookups, reductions or RoPE frequencies of its own. Every
    Triton module passes MLIR's verifier (which only the GPU would otherwise run)."""
    from learner.generate import decode_kernels as dk

    hf = qwen2.PRESETS["qwen2.5-0.5b"]
    cfg = qwen2.Qwen2Config.from_hf(hf, param_dtype="bfloat16", dtype="bfloat16")
    graphdef, state = nnx.split(qwen2.abstract(cfg))
    steps, width = 8, 64
    kv = jax.ShapeDtypeStruct((1, cfg.num_kv_heads, width + steps, cfg.head_dim), jnp.bfloat16)
    cache = tuple(qwen2.LayerCache(kv, kv) for _ in range(cfg.num_layers))
    i32 = jnp.int32
    args = (
        graphdef, state, cache, jax.ShapeDtypeStruct((1, cfg.vocab_size), jnp.float32),
        jax.ShapeDtypeStruct((1,), i32), jax.ShapeDtypeStruct((1,), jnp.uint32),
        jax.ShapeDtypeStruct((1, 0, 1), i32), jax.ShapeDtypeStruct((1,), i32),
        jax.ShapeDtypeStruct((), jnp.uint32),
    )  # fmt: skip
    options = dict(max_new=steps, temperature=0.0, top_k=0, top_p=1.0, pad_id=0, chunk=steps)
    for module in (dk, G):
        monkeypatch.setattr(module, "_interpret", lambda interpret: False)  # as on the GPU
    lower_to_triton = triton_lowering.lower_jaxpr_to_triton_module

    def verified(*args, **kwargs):  # the check the GPU runs on each module before compiling it
        result = lower_to_triton(*args, **kwargs)
        result.module.operation.verify()
        return result

    monkeypatch.setattr(triton_lowering, "lower_jaxpr_to_triton_module", verified)
    lowered = S.decode.trace(*args, kernels="pallas", **options).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    calls = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
    assert len(calls) == 2 + 6 * cfg.num_layers + 1
    for op in ("stablehlo.gather", "stablehlo.power", "stablehlo.dynamic_update_slice"):
        assert op not in text, op
    # Only the while loop's "all done" check reduces anything outside a kernel.
    assert text.count("stablehlo.reduce") == 1
