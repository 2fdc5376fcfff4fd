"""The train state (parameters, optimizer state, step, RNG) on a mesh, and the pieces every
trainer's jitted step is built from.

`TrainState` is a pytree: `step` (optimizer steps taken, int32), `params` (the model's
`nnx.State`), `opt_state` (optax's) and `rng` (the run's base key data, uint32); the model's
graph and the optax transformation ride along as static fields. Parameters are placed by the
model's `PARTITION_RULES` on a `(fsdp, tp)` mesh, the optimizer moments like their
parameters, scalars replicated; batches are split over `fsdp`.

Randomness is never carried forward: a step's key is `step_key(state, purpose)`, a pure
function of (seed, step, purpose), so a run resumed from a checkpoint draws exactly the
numbers it would have drawn without the interruption.

For a trainer:

    state = create_train_state(cfg, mesh, qcfg)          # or restore_or_create (sft.py)
    with jax.set_mesh(mesh):
        model = state.model()                              # inside a jitted step
        logp = sequence_logprobs(model, tokens, positions, segment_ids, chunk=...)
        state, stats = apply_gradients(state, grads)       # clipping, AdamW, schedule
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from learner.model import logprobs as model_logprobs
from learner.model import qwen2
from learner.model.params import PARTITION_RULES
from learner.sharding import AXES, fit_spec, make_mesh, match_rule
from learner.train.config import MeshConfig, OptimConfig, TrainConfig
from learner.train.policy import build_model

# Named streams of randomness: step_key(state, "sample") etc.
PURPOSES = ("sample", "eval", "rollout", "init")


# --------------------------------------------------------------------------------------------
# Optimizer
# --------------------------------------------------------------------------------------------


def lr_schedule(optim: OptimConfig) -> optax.Schedule:
    """Learning rate of step k (0-based): linear warm-up over `warmup_steps` from
    `lr / warmup_steps` (step 0 already learns) to `lr`, then cosine decay to
    `lr * end_lr_ratio` at `decay_steps` (0 = `total_steps`), constant after."""
    horizon = optim.decay_steps or optim.total_steps
    return optax.warmup_cosine_decay_schedule(
        init_value=optim.lr / optim.warmup_steps if optim.warmup_steps else optim.lr,
        peak_value=optim.lr,
        warmup_steps=optim.warmup_steps,
        decay_steps=max(horizon, optim.warmup_steps + 1),
        end_value=optim.lr * optim.end_lr_ratio,
    )


def _decay_mask(params: Any) -> Any:
    """Weight decay on matrices only (not on norms' scales or biases)."""
    return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(optim: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping (when `clip_norm` > 0), then AdamW on the schedule."""
    adamw = optax.adamw(
        lr_schedule(optim),
        b1=optim.b1,
        b2=optim.b2,
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        mask=_decay_mask,
    )
    if optim.clip_norm > 0:
        return optax.chain(optax.clip_by_global_norm(optim.clip_norm), adamw)
    return adamw


# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: nnx.State
    opt_state: Any
    rng: jax.Array
    graphdef: nnx.GraphDef = flax.struct.field(pytree_node=False)
    tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)

    def model(self) -> qwen2.Qwen2:
        """The model holding these parameters (call inside jit: it is a view, no copy)."""
        return nnx.merge(self.graphdef, self.params)

    def arrays(self) -> dict[str, Any]:
        """What a checkpoint holds: every array, no static parts."""
        return {
            "step": self.step,
            "params": self.params,
            "opt_state": self.opt_state,
            "rng": self.rng,
        }

    def with_arrays(self, arrays: dict[str, Any]) -> TrainState:
        return self.replace(**arrays)


def run_key_data(seed: int) -> np.ndarray:
    """The run's base key as raw uint32 data (checkpointable as a plain array)."""
    with jax.ensure_compile_time_eval():
        return np.asarray(jax.random.key_data(jax.random.key(seed)))


def step_key(rng: jax.Array, step: jax.Array | int, purpose: str) -> jax.Array:
    """The key for (base key, step, purpose): the only source of randomness a trainer uses."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}: expected one of {PURPOSES}")
    key = jax.random.wrap_key_data(jnp.asarray(rng, jnp.uint32))
    return jax.random.fold_in(jax.random.fold_in(key, PURPOSES.index(purpose)), step)


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A host-side integer seed for (seed, step, purpose), e.g. for the sampler's rows."""
    key = step_key(run_key_data(seed), step, purpose)
    return int(jax.random.bits(key, dtype=jnp.uint32))


# --------------------------------------------------------------------------------------------
# Shardings
# --------------------------------------------------------------------------------------------


def _param_path(keypath: tuple[Any, ...]) -> str:
    """The dotted parameter path of a pytree key path into an nnx.State (drops `.value`)."""
    parts = []
    for key in keypath:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey) and key.name != "value":
            parts.append(key.name)
    return ".".join(parts)


def param_shardings(params: Any, mesh: Mesh) -> Any:
    """A tree like `params` of `NamedSharding`s from the model's partition rules."""
    axis_sizes = dict(mesh.shape)

    def one(keypath: tuple[Any, ...], x: Any) -> NamedSharding:
        axes = match_rule(_param_path(keypath), PARTITION_RULES)
        return NamedSharding(mesh, fit_spec(x.shape, axes, axis_sizes))

    return jax.tree_util.tree_map_with_path(one, params)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
    """Shardings for every array of `state` (abstract or concrete): moments like their
    parameters, everything else replicated."""
    params = param_shardings(state.params, mesh)
    opt = optax.tree_map_params(
        state.tx,
        lambda _, sharding: sharding,
        state.opt_state,
        params,
        transform_non_params=lambda _: replicated(mesh),
    )
    return state.replace(step=replicated(mesh), params=params, opt_state=opt, rng=replicated(mesh))


def batch_spec(ndim: int, axis: int = 0) -> PartitionSpec:
    """`fsdp` on dimension `axis` (the rows), the rest whole."""
    return PartitionSpec(*[AXES[0] if d == axis else None for d in range(ndim)])


def put_batch(batch: dict[str, np.ndarray], mesh: Mesh, axis: int = 0) -> dict[str, jax.Array]:
    """This host's share of a global batch as global arrays split over `fsdp` on `axis`.

    On one host the arrays are the whole batch; on P hosts each holds its rows and the
    global array is P times larger along `axis` (the loader hands each host its share).
    """
    out = {}
    for key, local in batch.items():
        local = np.asarray(local)
        spec = fit_spec(
            _global_shape(local.shape, axis), batch_spec(local.ndim, axis), dict(mesh.shape)
        )
        sharding = NamedSharding(mesh, spec)
        out[key] = jax.make_array_from_process_local_data(
            sharding, local, _global_shape(local.shape, axis)
        )
    return out


def _global_shape(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return tuple(n * jax.process_count() if d == axis else n for d, n in enumerate(shape))


def mesh_for(cfg: MeshConfig) -> Mesh:
    return make_mesh(cfg.fsdp, cfg.tp)


# --------------------------------------------------------------------------------------------
# Creation
# --------------------------------------------------------------------------------------------


def _assemble(model: qwen2.Qwen2, tx: optax.GradientTransformation, seed: int) -> TrainState:
    graphdef, params = nnx.split(model)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        rng=jnp.asarray(run_key_data(seed)),
        graphdef=graphdef,
        tx=tx,
    )


def abstract_train_state(
    cfg: TrainConfig, qcfg: qwen2.Qwen2Config, mesh: Mesh
) -> tuple[TrainState, TrainState]:
    """(state of `ShapeDtypeStruct`s carrying shardings, its shardings): no memory, no
    compute; what a restore targets and what shape checks read."""
    tx = make_optimizer(cfg.optim)
    abstract = jax.eval_shape(lambda: _assemble(qwen2.abstract(qcfg), tx, cfg.seed))
    shardings = state_shardings(abstract, mesh)
    placed = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
    )
    return placed, shardings


def create_train_state(cfg: TrainConfig, qcfg: qwen2.Qwen2Config, mesh: Mesh) -> TrainState:
    """A fresh state: the starting parameters (from `model.path` or drawn from the seed)
    placed on `mesh`, zero moments, step 0."""
    tx = make_optimizer(cfg.optim)
    model = build_model(cfg.model, qcfg, seed=cfg.seed, mesh=mesh)
    graphdef, params = nnx.split(model)
    template = jax.eval_shape(lambda: _assemble(qwen2.abstract(qcfg), tx, cfg.seed))
    shardings = state_shardings(template, mesh)

    def init(params: nnx.State) -> TrainState:
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            rng=jnp.asarray(run_key_data(cfg.seed)),
            graphdef=graphdef,
            tx=tx,
        )

    with jax.set_mesh(mesh):
        return jax.jit(init, in_shardings=(shardings.params,), out_shardings=shardings)(params)


# --------------------------------------------------------------------------------------------
# Step pieces
# --------------------------------------------------------------------------------------------


def sequence_logprobs(
    model: qwen2.Qwen2,
    tokens: jax.Array,
    positions: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    *,
    chunk: int = 0,
) -> jax.Array:
    """log p(tokens[:, t+1] | row up to t) for t < time - 1: [batch, time - 1], float32.

    `segment_ids` ([batch, time], 0 = padding) keeps packed examples apart, `positions`
    restart per example; without them a row is one causal sequence. Entries whose next token
    belongs to another segment are meaningless: mask them with the row's loss mask.
    `chunk` > 0 projects to the vocabulary that many positions at a time (memory).
    """
    return model_logprobs.next_token_logprobs(
        model, tokens, positions, chunk=chunk, segment_ids=segment_ids
    )


def global_norm(tree: Any) -> jax.Array:
    """sqrt of the sum of squares of every leaf, in float32."""
    leaves = jax.tree.leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def apply_gradients(state: TrainState, grads: Any) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step (clipping, AdamW, the schedule's learning rate) from `grads`,
    which must be the gradient of the step's mean loss. Returns the new state and
    `grad_norm` (before clipping) and `update_norm`."""
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    stats = {"grad_norm": global_norm(grads), "update_norm": global_norm(updates)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), stats


def zeros_like_params(state: TrainState) -> Any:
    """Float32 zeros shaped like the parameters (gradient accumulators)."""
    return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)


def param_count(params: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def host_params(state: TrainState) -> dict[str, np.ndarray]:
    """{dotted path: host array} of the parameters (gathered; for tests and export)."""
    flat = jax.tree_util.tree_flatten_with_path(state.params)[0]
    return {_param_path(path): np.asarray(jax.device_get(x)) for path, x in flat}
