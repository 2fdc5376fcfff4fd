"""Batched sampling with a KV cache: one jitted prefill, one jitted decode loop.

Prompts of different lengths are left-padded to a common length P (rounded up to a bucket, so
few shapes compile), which makes every row write the same cache slot at every step: the cache
update is one dynamic-update-slice and the whole decode is a `lax.while_loop` on device that
stops when every row has finished. The host sees the results once, at the end. Pad slots are
masked out of attention and each row's rotary positions start at 0, so a row's result does not
depend on what it was batched with.

Per token the loop samples (temperature, top-k, top-p), records the token's log-probability
under the model (temperature 1, before any filtering: what a policy-gradient loss needs), checks
EOS ids and each row's stop sequences, then runs the model on the new token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner.generate import greedy_kernels
from learner.generate.decode import (
    DecodeWeights,
    check_decode_kernels,
    fuse_decode_weights,
    fused_decode,
    uses_pallas,
)
from learner.model import qwen2
from learner.sharding import batch_sharding

DEFAULT_STOP = ("</triton_code>",)
FINISH_REASONS = ("length", "eos", "stop")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. temperature 0 is greedy; top_k 0 and top_p 1 switch those off."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")


@dataclasses.dataclass
class Completion:
    """One sampled continuation. `tokens` include the final EOS or stop tokens, if any."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "length", "eos" or "stop"
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


def filter_logits(
    logits: jax.Array, top_k: int, top_p: float
) -> tuple[jax.Array, jax.Array | None]:
    """Restrict one row's logits [V] to its top-k / nucleus; returns (logits, their token ids).

    With top_k > 0 the result has k entries and the ids map them back to the vocabulary; with
    only top_p the whole vocabulary is sorted. Ids are None when nothing was filtered.
    """
    ids = None
    if top_k > 0:
        logits, ids = jax.lax.top_k(logits, top_k)
    if top_p < 1.0:
        if ids is None:
            ids = jnp.argsort(-logits)
            logits = logits[ids]
        probs = jax.nn.softmax(logits)
        before = jnp.cumsum(probs) - probs  # mass of strictly better tokens (sorted descending)
        logits = jnp.where(before < top_p, logits, -jnp.inf)
    return logits, ids


def sample_row(
    key: jax.Array, logits: jax.Array, temperature: float, top_k: int, top_p: float
) -> jax.Array:
    """One token id from one row of float32 logits."""
    if temperature == 0.0:
        return jnp.argmax(logits).astype(jnp.int32)
    filtered, ids = filter_logits(logits / temperature, top_k, top_p)
    choice = jax.random.categorical(key, filtered)
    return (choice if ids is None else ids[choice]).astype(jnp.int32)


def _merge_stats(
    a: tuple[jax.Array, jax.Array, jax.Array], b: tuple[jax.Array, jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Two (max, index of the first max, sum of exp(x - max)) summaries as one."""
    (top_a, at_a, sum_a), (top_b, at_b, sum_b) = a, b
    top = jnp.maximum(top_a, top_b)
    at = jnp.where(
        (top_a > top_b) | ((top_a == top_b) & (at_a < at_b)) | jnp.isnan(top_a), at_a, at_b
    )
    # A side at the max keeps its sum as is: exp(0) = 1, and -inf - -inf would be NaN.
    total = jnp.where(top_a == top, sum_a, sum_a * jnp.exp(top_a - top)) + jnp.where(
        top_b == top, sum_b, sum_b * jnp.exp(top_b - top)
    )
    return top, at, total


def logit_stats(logits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Each row's max, argmax and logsumexp, [B] each, from one pass over logits [B, V].

    `jnp.argmax` and `jax.nn.logsumexp` are three reductions (argmax, max, sum); a decode
    step at batch 1 pays a kernel launch for each, so one reduction carries an online
    softmax's running (max, its first index, sum of exp(x - max)) instead.
    """
    zero = jnp.zeros((), logits.dtype)
    top, best, total = jax.lax.reduce(
        (logits, jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1), jnp.ones_like(logits)),
        (jnp.asarray(-jnp.inf, logits.dtype), jnp.int32(logits.shape[1]), zero),
        _merge_stats,
        (1,),
    )
    return top, best, top + jnp.log(total)


def stop_hits(window: jax.Array, stops: jax.Array) -> jax.Array:
    """Rows whose last tokens equal one of their stop sequences.

    window: [B, L] most recent tokens (oldest first; -2 before any token was generated).
    stops: [B, N, L] right-aligned stop sequences, -1 where shorter than L (matches anything).
    """
    if stops.shape[1] == 0:
        return jnp.zeros(window.shape[0], dtype=bool)
    equal = (stops == window[:, None, :]) | (stops < 0)
    real = jnp.any(stops >= 0, axis=-1)
    return jnp.any(jnp.all(equal, axis=-1) & real, axis=-1)


def left_pad(
    prompts: Sequence[Sequence[int]], bucket: int, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """[B, P] left-padded tokens (P a multiple of `bucket`) and each row's first real slot."""
    longest = max(len(p) for p in prompts)
    width = max(bucket, -(-longest // bucket) * bucket)
    tokens = np.full((len(prompts), width), pad_id, dtype=np.int32)
    starts = np.zeros(len(prompts), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        starts[row] = width - len(prompt)
        tokens[row, starts[row] :] = prompt
    return tokens, starts


def stop_table(stops: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Per-row lists of token sequences -> the [B, N, L] array `stop_hits` reads."""
    n = max((len(s) for s in stops), default=0)
    length = max((len(seq) for s in stops for seq in s), default=1)
    table = np.full((len(stops), n, length), -1, dtype=np.int32)
    for row, seqs in enumerate(stops):
        for j, seq in enumerate(seqs):
            if seq:
                table[row, j, length - len(seq) :] = seq
    return table


# --------------------------------------------------------------------------------------------
# Jitted steps
# --------------------------------------------------------------------------------------------


def _prefill(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    tokens: jax.Array,
    starts: jax.Array,
    *,
    cache_len: int,
    cache_dtype: Any,
) -> tuple[qwen2.Cache, jax.Array]:
    """Run the padded prompts; return the filled cache and the last position's logits."""
    model = nnx.merge(graphdef, state)
    batch, width = tokens.shape
    slots = jnp.arange(width)
    positions = jnp.maximum(slots[None, :] - starts[:, None], 0)
    mask = qwen2.causal_mask(batch, width) & (slots[None, None, :] >= starts[:, None, None])
    cache = qwen2.init_cache(model.config, batch, cache_len, cache_dtype)
    hidden, cache = model.hidden_states(tokens, positions, mask, cache)
    return cache, model.logits(hidden[:, -1:])[:, 0]


def _check_kernels(fused: bool, kernels: str) -> None:
    check_decode_kernels(kernels)
    if not fused and kernels == "pallas":
        raise ValueError(f"decode kernels {kernels!r} need the fused decode path (fused=True)")


def decode_steps(max_new: int, chunk: int) -> int:
    """Decode steps actually run: `max_new` rounded up to whole chunks (cache and buffers fit this)."""
    return -(-max_new // chunk) * chunk


def _decode(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    cache: qwen2.Cache,
    logits: jax.Array,
    starts: jax.Array,
    seeds: jax.Array,
    stops: jax.Array,
    eos_ids: jax.Array,
    base_seed: jax.Array,
    *,
    max_new: int,
    temperature: float,
    top_k: int,
    top_p: float,
    pad_id: int,
    chunk: int = 8,
    fused: bool = True,
    kernels: str = "auto",
) -> tuple[tuple[jax.Array, ...], qwen2.Cache]:
    """Sample up to `max_new` tokens per row on device; stops early when all rows are done.

    The loop runs `chunk` steps at a time (a fixed-trip-count inner loop, which needs no
    device-to-host predicate check) inside a while loop that checks "all done" once a chunk.
    The cache must hold `width + decode_steps(max_new, chunk)` slots. Returns (tokens, logprobs,
    lengths, finish codes), each [B, max_new] or [B], and the final cache, which reuses the
    donated input cache's memory.

    `fused` runs each token through `fused_decode` on weights regrouped once, here, before
    the loop (fewer, larger kernels per token: what bounds batch-1 decode on a GPU); False runs
    the model's own modules, the reference the fused path is tested and benchmarked against.
    `kernels` picks the fused path's kernels (`learner.generate.decode.DECODE_KERNELS`): "xla", "pallas" for
    hand-written ones at small batches on one device, or "auto" for those where they are
    faster (see `fused_decode`). A greedy decode on the Pallas kernels also does each
    step's bookkeeping in Pallas (`_greedy_pallas_decode`).
    """
    _check_kernels(fused, kernels)
    model = nnx.merge(graphdef, state)
    weights = fuse_decode_weights(model) if fused else None
    cfg = model.config
    batch = logits.shape[0]
    cache_len = cache[0].k.shape[2]
    steps = decode_steps(max_new, chunk)
    width = cache_len - steps  # the padded prompt length
    if temperature == 0.0 and weights is not None and uses_pallas(kernels, batch, 1):
        return _greedy_pallas_decode(
            cfg, weights, cache, logits, starts, stops, eos_ids,
            max_new=max_new, pad_id=pad_id, chunk=chunk, kernels=kernels, width=width,
        )  # fmt: skip
    prompt_lens = width - starts
    slots = jnp.arange(cache_len)
    rope = qwen2.rope_table(cache_len, cfg.head_dim, cfg.rope_theta)  # positions < cache_len
    valid_from = slots[None, :] >= starts[:, None]  # [B, S]
    sample = jax.vmap(
        functools.partial(sample_row, temperature=temperature, top_k=top_k, top_p=top_p)
    )
    fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))
    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(base_seed), seeds)

    def one_token(_: int, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        step, cache, logits, out_tokens, out_logprobs, lengths, done, reason, window = carry
        top, best, logsumexp = logit_stats(logits)
        if temperature == 0.0:
            token, picked = best, top
        else:
            token = sample(fold(row_keys, step), logits)
            picked = jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0]
        logprob = picked - logsumexp
        token = jnp.where(done, pad_id, token)
        out_tokens = jax.lax.dynamic_update_slice(out_tokens, token[:, None], (0, step))
        out_logprobs = jax.lax.dynamic_update_slice(
            out_logprobs, jnp.where(done, 0.0, logprob)[:, None], (0, step)
        )
        lengths = lengths + (~done).astype(jnp.int32)
        window = jnp.concatenate([window[:, 1:], token[:, None]], axis=1)
        is_eos = jnp.any(token[:, None] == eos_ids[None, :], axis=-1)
        is_stop = stop_hits(window, stops)
        reason = jnp.where(done, reason, jnp.where(is_stop, 2, jnp.where(is_eos, 1, 0)))
        done = done | is_eos | is_stop | (step + 1 >= max_new)
        slot = width + step
        mask = (valid_from & (slots[None, :] <= slot))[:, None, :]
        positions = (prompt_lens + step)[:, None]
        if weights is None:
            logits, cache = model(token[:, None], positions, mask, cache, slot)
        else:
            logits, cache = fused_decode(
                cfg, weights, token[:, None], positions, mask, cache, slot, kernels, rope, starts
            )
        return (
            step + 1,
            cache,
            logits[:, 0],
            out_tokens,
            out_logprobs,
            lengths,
            done,
            reason,
            window,
        )

    def cond(carry: tuple[Any, ...]) -> jax.Array:
        return ~jnp.all(carry[6])

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        return jax.lax.fori_loop(0, chunk, one_token, carry)

    carry = (
        jnp.int32(0),
        cache,
        logits,
        jnp.full((batch, steps), pad_id, dtype=jnp.int32),
        jnp.zeros((batch, steps), dtype=jnp.float32),
        jnp.zeros(batch, dtype=jnp.int32),
        jnp.zeros(batch, dtype=bool),
        jnp.zeros(batch, dtype=jnp.int32),
        jnp.full((batch, stops.shape[2]), -2, dtype=jnp.int32),
    )
    _, cache, _, out_tokens, out_logprobs, lengths, _, reason, _ = jax.lax.while_loop(
        cond, body, carry
    )
    return (out_tokens[:, :max_new], out_logprobs[:, :max_new], lengths, reason), cache


def _greedy_pallas_decode(
    cfg: qwen2.Qwen2Config,
    weights: DecodeWeights,
    cache: qwen2.Cache,
    logits: jax.Array,
    starts: jax.Array,
    stops: jax.Array,
    eos_ids: jax.Array,
    *,
    max_new: int,
    pad_id: int,
    chunk: int,
    kernels: str,
    width: int,
) -> tuple[tuple[jax.Array, ...], qwen2.Cache]:
    """`_decode`'s greedy loop on the Pallas path: each step's bookkeeping (the token, its
    log-probability, lengths, stops, the next embedding rows) is two kernels of
    `greedy_kernels` instead of about a dozen of XLA's, the same results."""
    batch, vocab = logits.shape
    steps = decode_steps(max_new, chunk)
    prompt_lens = (width - starts).astype(jnp.int32)
    i32 = jnp.int32

    def one_token(_: int, carry: tuple[Any, ...]) -> tuple[Any, ...]:
        state, cache, logits = carry
        partials = greedy_kernels.logit_partials(logits)
        state, nxt = greedy_kernels.greedy_update(
            partials, state, prompt_lens, weights.embedding, eos_ids, stops,
            vocab=vocab, width=width, max_new=max_new, pad_id=pad_id,
        )  # fmt: skip
        logits, cache = fused_decode(
            cfg, weights, None, nxt.positions[:, None], None, cache, nxt.index, kernels,
            starts=starts, embedded=nxt.rows[:, None],
        )  # fmt: skip
        return state, cache, logits[:, 0]

    def cond(carry: tuple[Any, ...]) -> jax.Array:
        return ~jnp.all(carry[0].done != 0)

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        return jax.lax.fori_loop(0, chunk, one_token, carry)

    state = greedy_kernels.GreedyState(
        step=jnp.zeros(1, i32),
        tokens=jnp.full((batch, steps), pad_id, dtype=i32),
        logprobs=jnp.zeros((batch, steps), dtype=jnp.float32),
        lengths=jnp.zeros(batch, dtype=i32),
        done=jnp.zeros(batch, dtype=i32),
        reason=jnp.zeros(batch, dtype=i32),
        window=jnp.full((batch, stops.shape[2]), -2, dtype=i32),
    )
    state, cache, _ = jax.lax.while_loop(cond, body, (state, cache, logits))
    outputs = (state.tokens[:, :max_new], state.logprobs[:, :max_new], state.lengths, state.reason)
    return outputs, cache


# Module-level, so every Sampler (and every weight update) shares the compiled programs.
prefill = jax.jit(_prefill, static_argnums=0, static_argnames=("cache_len", "cache_dtype"))
decode = jax.jit(
    _decode,
    static_argnums=0,
    static_argnames=(
        "max_new",
        "temperature",
        "top_k",
        "top_p",
        "pad_id",
        "chunk",
        "fused",
        "kernels",
    ),
    donate_argnames=("cache",),
)


# --------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------


class Sampler:
    """Samples completions from a model; reuse one instance so compiled steps are reused.

    `tokenizer` (an HF tokenizer) is needed for text prompts, text stop strings and `text` in the
    results; with token-id prompts it is optional. `set_model` swaps in new weights of the same
    structure (an RL step) without recompiling. `fused_decode=False` decodes through the
    model's own modules: slower, but without a second copy of the projections in memory.
    `decode_kernels="pallas"` runs the fused decode through hand-written Pallas kernels where
    they apply (few rows, one device); "xla" leaves every kernel to XLA; "auto" (the default)
    takes the Pallas kernels on a GPU for the one or two rows where they are faster.
    """

    def __init__(
        self,
        model: qwen2.Qwen2,
        tokenizer: Any = None,
        *,
        eos_ids: Sequence[int] = (),
        mesh: Mesh | None = None,
        prompt_bucket: int = 64,
        cache_dtype: Any = None,
        pad_id: int = 0,
        chunk: int = 8,
        fused_decode: bool = True,
        decode_kernels: str = "auto",
    ) -> None:
        _check_kernels(fused_decode, decode_kernels)
        self.config: qwen2.Qwen2Config = model.config
        self.graphdef, self.state = nnx.split(model)
        self.tokenizer = tokenizer
        self.eos_ids = list(eos_ids)
        self.mesh = mesh
        self.prompt_bucket = prompt_bucket
        self.cache_dtype = cache_dtype or self.config.compute_dtype
        self.pad_id = pad_id
        self.chunk = chunk
        # Regrouped projections decode faster but hold a second copy of them while decoding.
        self.fused_decode = fused_decode
        self.decode_kernels = decode_kernels

    def set_model(self, model: qwen2.Qwen2) -> None:
        self.state = nnx.state(model)

    # -- inputs ---------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("text prompts and stop strings need a tokenizer")
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _stop_ids(
        self, stop: Sequence[str] | Sequence[Sequence[str]] | None, batch: int
    ) -> tuple[list[list[str]], list[list[list[int]]]]:
        if stop is None:
            stop = DEFAULT_STOP if self.tokenizer is not None else ()
        per_row = (
            [list(s) for s in stop]
            if stop and not isinstance(stop[0], str)
            else [list(stop)] * batch
        )
        if len(per_row) != batch:
            raise ValueError(f"{len(per_row)} stop lists for {batch} prompts")
        return per_row, [[self._encode(s) for s in row] for row in per_row]

    # -- running --------------------------------------------------------------------------

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        stop_ids: Sequence[Sequence[Sequence[int]]] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The device part: token-id prompts in; tokens, logprobs, lengths, reasons out."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        batch = len(prompts)
        tokens, starts = left_pad(prompts, self.prompt_bucket, self.pad_id)
        cache_len = tokens.shape[1] + decode_steps(params.max_new_tokens, self.chunk)
        stops = stop_table(stop_ids or [[] for _ in range(batch)])
        row_seeds = np.asarray(range(batch) if seeds is None else seeds, dtype=np.uint32)
        tokens_d, starts_d, stops_d, seeds_d = (
            self._put(x, True) for x in (tokens, starts, stops, row_seeds)
        )
        eos = self._put(np.asarray(self.eos_ids, dtype=np.int32), False)
        base_seed = self._put(np.asarray(params.seed, dtype=np.uint32), False)
        with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
            cache, logits = prefill(
                self.graphdef,
                self.state,
                tokens_d,
                starts_d,
                cache_len=cache_len,
                cache_dtype=self.cache_dtype,
            )
            out, _ = decode(
                self.graphdef,
                self.state,
                cache,
                logits,
                starts_d,
                seeds_d,
                stops_d,
                eos,
                base_seed,
                max_new=params.max_new_tokens,
                temperature=float(params.temperature),
                top_k=int(params.top_k),
                top_p=float(params.top_p),
                pad_id=self.pad_id,
                chunk=self.chunk,
                fused=self.fused_decode,
                kernels=self.decode_kernels,
            )
        if jax.process_count() > 1:  # rows live on other hosts too: gather them everywhere
            from jax.experimental import multihost_utils

            out = multihost_utils.process_allgather(out, tiled=True)
        return tuple(np.asarray(x) for x in jax.device_get(out))  # type: ignore[return-value]

    def _put(self, x: np.ndarray, by_batch: bool) -> Any:
        """A host array as a global device array: split along the batch, or replicated."""
        if self.mesh is None:
            return x
        sharding = (
            batch_sharding(self.mesh, x.shape)
            if by_batch
            else NamedSharding(self.mesh, PartitionSpec())
        )
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | None = None,
        *,
        stop: Sequence[str] | Sequence[Sequence[str]] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """Sample one completion per prompt (repeat a prompt G times for G samples).

        `stop`: stop strings for every row, or one list per row; default `</triton_code>` when
        there is a tokenizer. `seeds`: one per row (default 0..B-1); a row's randomness depends
        only on `params.seed` and its own seed, not on its batch.
        """
        params = params or SamplingParams()
        ids = [self._encode(p) if isinstance(p, str) else list(p) for p in prompts]
        stop_strings, stop_ids = self._stop_ids(stop, len(ids))
        tokens, logprobs, lengths, reasons = self.run(ids, params, stop_ids, seeds)
        results = []
        for row in range(len(ids)):
            n = int(lengths[row])
            completion = Completion(
                tokens=tokens[row, :n].tolist(),
                logprobs=logprobs[row, :n].tolist(),
                finish_reason=FINISH_REASONS[int(reasons[row])],
            )
            if self.tokenizer is not None:
                self._finish_text(completion, stop_strings[row])
            results.append(completion)
        return results

    def _finish_text(self, completion: Completion, stops: Sequence[str]) -> None:
        """Decode the text; cut at a stop string the token match missed (other tokenisation)."""
        detok = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        body = completion.tokens[:-1] if completion.finish_reason == "eos" else completion.tokens
        text = detok(body)
        if completion.finish_reason != "stop":
            found = [(text.find(s), s) for s in stops if s and s in text]
            if found:
                _, first = min(found)
                cut = next(k for k in range(1, len(body) + 1) if first in detok(body[:k]))
                completion.tokens = completion.tokens[:cut]
                completion.logprobs = completion.logprobs[:cut]
                completion.finish_reason = "stop"
                text = detok(body[:cut])
                text = text[: text.find(first) + len(first)]
        completion.text = text
