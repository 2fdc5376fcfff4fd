"""The RL update as one jitted function: recompute log-probs, the objective, one optimizer step.

Per step the trainer hands over an `RLBatch` (behaviour log-probs, masks, verdicts as
arrays) and the token arrays of `learner.rl.rollout` (prompts left-padded to a fixed width
W, completions after them). Here the current policy scores every completion token again
(`completion_logprobs`: the differentiated input of the objective), the algorithm's pure
loss (`learner.rl.algorithms`) turns them into a loss, and `learner.train.state.
apply_gradients` takes the optimizer step.

Log-prob consistency: the same function measures how far the trainer's log-probs of the
behaviour policy are from the sampler's (`logprob_gap_mean` / `logprob_gap_max` over every
sampled token). On-policy the current parameters are the behaviour policy's, so the loss's
own forward pass gives them for free; one step off-policy (overlap) the parameters that
sampled are passed as `behaviour` and scored in a second forward pass (no gradient). The
trainer fails the run when the maximum exceeds `rl.max_logprob_gap`, before the new
parameters are saved or used.

Gradient accumulation (`accum` > 1, `optim.grad_accum`): the batch is cut into `accum`
micro-batches of whole prompt groups (a group's G samples never straddle two), each scored
and differentiated in turn inside one `lax.scan`, so memory holds one micro-batch's
activations. Objectives that couple micro-batches (DRPO's batch KL) first score every
micro-batch without gradient for the algorithm's `coupling_fn`; each micro-batch's
`micro_loss_fn` then has gradients that sum to the full batch's exactly. The metrics are
the full-batch loss function's, on the log-probs the micro-batches produced.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from learner.model import qwen2
from learner.model.logprobs import gather_logprobs
from learner.rl.algorithms import Algorithm, get_algorithm
from learner.rl.common import RLBatch
from learner.sharding import AXES, constrain
from learner.train.state import TrainState, apply_gradients, zeros_like_params


def _project(model: qwen2.Qwen2, hidden: jax.Array, targets: jax.Array, chunk: int) -> jax.Array:
    """log p(target) from hidden states [N, T, M], `chunk` positions at a time (0 = all)."""
    n, steps = targets.shape
    if chunk <= 0 or steps <= chunk:
        return gather_logprobs(model.logits(hidden), targets)
    pad = -steps % chunk
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    pieces = hidden.shape[1] // chunk
    hidden = hidden.reshape(n, pieces, chunk, -1).swapaxes(0, 1)
    targets = targets.reshape(n, pieces, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(args: tuple[jax.Array, jax.Array]) -> jax.Array:
        return gather_logprobs(model.logits(args[0]), args[1])

    out = jax.lax.map(one, (hidden, targets))
    return out.swapaxes(0, 1).reshape(n, pieces * chunk)[:, :steps]


def completion_logprobs(
    model: qwen2.Qwen2, tokens: jax.Array, starts: jax.Array, width: int, *, chunk: int = 0
) -> jax.Array:
    """[N, T] log-probs of the completion tokens (slots W .. W+T-1) under `model`.

    Rows are left-padded prompts (first real slot `starts`), as the sampler lays them out:
    positions count from each row's first real token and pad slots are never attended to,
    so a row's numbers do not depend on its padding.
    """
    n, length = tokens.shape
    slots = jnp.arange(length)
    positions = jnp.maximum(slots[None, :] - starts[:, None], 0)
    mask = qwen2.causal_mask(n, length) & (slots[None, None, :] >= starts[:, None, None])
    hidden, _ = model.hidden_states(tokens, positions, mask)
    return _project(model, hidden[:, width - 1 : -1], tokens[:, width:], chunk)


def logprob_gap(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Mean and max |logp - old_logp| over the sampled tokens."""
    gap = jnp.where(mask, jnp.abs(logp - old_logp), 0.0)
    count = jnp.maximum(mask.sum(), 1)
    return {"logprob_gap_mean": gap.sum() / count, "logprob_gap_max": gap.max()}


def check_accum(accum: int, n_prompts: int) -> None:
    """Raise ValueError unless `accum` micro-batches of whole prompt groups fit the batch."""
    if accum < 1 or n_prompts % accum:
        raise ValueError(f"grad_accum={accum} must divide the batch's {n_prompts} prompts")


def split_micro(x: jax.Array, accum: int) -> jax.Array:
    """[n, ...] -> [accum, n / accum, ...]: micro-batch k holds rows k·n/accum onwards (whole
    prompt groups, since rows are prompt-major), its rows split over `fsdp`."""
    out = x.reshape(accum, x.shape[0] // accum, *x.shape[1:])
    return constrain(out, (None, AXES[0]) + (None,) * (x.ndim - 1))


def merge_micro(x: jax.Array) -> jax.Array:
    """[accum, m, ...] -> [accum · m, ...], the inverse of `split_micro`."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _scorer(state: TrainState, shape: tuple[int, ...], width: int, chunk: int) -> Any:
    """score(params, tokens, starts) -> log-probs of these rows' completions, as `shape`."""

    def score(params: Any, tokens: jax.Array, starts: jax.Array) -> jax.Array:
        model = nnx.merge(state.graphdef, params)
        return completion_logprobs(model, tokens, starts, width, chunk=chunk).reshape(shape)

    return score


def score_without_gradient(
    state: TrainState,
    params: Any,
    tokens: jax.Array,
    starts: jax.Array,
    shape: tuple[int, ...],
    *,
    width: int,
    chunk: int,
    accum: int,
) -> jax.Array:
    """[B,G,T] log-probs under `params`, no gradient; `accum` > 1 scores one micro-batch at a
    time, so memory holds one micro-batch's activations."""
    params = jax.lax.stop_gradient(params)
    score = _scorer(state, (shape[0] // accum, *shape[1:]), width, chunk)
    if accum == 1:
        return score(params, tokens, starts)
    rows = (split_micro(tokens, accum), split_micro(starts, accum))
    return merge_micro(jax.lax.map(lambda xs: score(params, *xs), rows))


def accumulated_gradients(
    state: TrainState,
    batch: RLBatch,
    tokens: jax.Array,
    starts: jax.Array,
    *,
    algo: Algorithm,
    loss_config: Any,
    width: int,
    chunk: int,
    accum: int,
) -> tuple[jax.Array, Any]:
    """([B,G,T] current log-probs, float32 gradient of the full-batch loss) from `accum`
    micro-batches of whole prompt groups: an optional pass without gradient for the
    coupling, then one `lax.scan` summing the micro-batch losses' gradients."""
    shape = batch.old_logp.shape
    check_accum(accum, shape[0])
    logp = None
    if algo.coupling_reads_logp:
        logp = score_without_gradient(
            state, state.params, tokens, starts, shape, width=width, chunk=chunk, accum=accum
        )
    coupling = algo.coupling_fn(batch, logp, loss_config)

    micro_batch = jax.tree.map(lambda x: split_micro(x, accum), batch)
    micro_rows = (split_micro(tokens, accum), split_micro(starts, accum))
    score = _scorer(state, (shape[0] // accum, *shape[1:]), width, chunk)

    def accumulate(grads: Any, micro: tuple[RLBatch, jax.Array, jax.Array]) -> Any:
        batch_m, tokens_m, starts_m = micro

        def objective(params: Any) -> tuple[jax.Array, jax.Array]:
            logp_m = score(params, tokens_m, starts_m)
            return algo.micro_loss_fn(batch_m, logp_m, loss_config, coupling), logp_m

        (_, logp_m), grad = jax.value_and_grad(objective, has_aux=True)(state.params)
        grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads, grad)
        return grads, logp_m

    grads, logp_parts = jax.lax.scan(
        accumulate, zeros_like_params(state), (micro_batch, *micro_rows)
    )
    return merge_micro(logp_parts), grads


def rl_step(
    state: TrainState,
    batch: RLBatch,
    tokens: jax.Array,
    starts: jax.Array,
    behaviour: Any = None,
    reference: Any = None,
    *,
    width: int,
    algorithm: str,
    loss_config: Any,
    chunk: int = 0,
    accum: int = 1,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One RL update. `behaviour`: the parameters that sampled when they are not the current
    ones (one step off-policy), else None. `reference`: the reference policy's parameters
    (GRPO's KL; None when unused). `accum`: micro-batches (whole prompt groups) whose
    gradients are summed; it must divide B. Returns the new state and float32 scalar
    metrics."""
    algo = get_algorithm(algorithm)
    shape = batch.old_logp.shape
    check_accum(accum, shape[0])

    def score(params: Any) -> jax.Array:
        return score_without_gradient(
            state, params, tokens, starts, shape, width=width, chunk=chunk, accum=accum
        )

    if reference is not None:
        batch = batch._replace(ref_logp=score(reference))

    if accum == 1:
        forward = _scorer(state, shape, width, chunk)

        def objective(params: Any) -> tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array]]:
            logp = forward(params, tokens, starts)
            loss, metrics = algo.loss_fn(batch, logp, loss_config)
            return loss, (metrics, logp)

        (loss, (metrics, logp)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    else:
        logp, grads = accumulated_gradients(
            state, batch, tokens, starts,
            algo=algo, loss_config=loss_config, width=width, chunk=chunk, accum=accum,
        )  # fmt: skip
        loss, metrics = algo.loss_fn(batch, jax.lax.stop_gradient(logp), loss_config)
    behaviour_logp = logp if behaviour is None else score(behaviour)
    gap = logprob_gap(jax.lax.stop_gradient(behaviour_logp), batch.old_logp, batch.mask)
    state, stats = apply_gradients(state, grads)
    return state, {"loss": loss, **metrics, **gap, **stats}


def make_rl_step(
    shardings: TrainState,
    *,
    width: int,
    algorithm: str,
    loss_config: Any,
    chunk: int,
    donate: bool,
    behaviour: bool,
    reference: bool,
    accum: int = 1,
) -> Any:
    """`rl_step` compiled for these static settings, the state pinned to `shardings` (so it
    keeps the layout its checkpoints restore to). `behaviour` / `reference`: whether those
    parameters are passed. `donate` gives the old state's memory to the new one (only when
    nothing else, e.g. a rollout sampled ahead, still reads the old parameters). `accum`:
    micro-batches per step (gradient accumulation)."""
    fn = functools.partial(
        rl_step,
        width=width,
        algorithm=algorithm,
        loss_config=loss_config,
        chunk=chunk,
        accum=accum,
    )
    params = shardings.params
    return jax.jit(
        fn,
        in_shardings=(
            shardings, None, None, None, params if behaviour else None,
            params if reference else None,
        ),
        out_shardings=(shardings, None),
        donate_argnums=(0,) if donate else (),
    )  # fmt: skip
