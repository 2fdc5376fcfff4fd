"""Supervised fine-tuning on the teacher's verified pairs.

The loss is the mean cross-entropy over the completion tokens (`loss_mask`) of packed rows,
every example attending only to itself (`segment_ids`, per-example `positions`). One
optimizer step sees `optim.grad_accum` micro-batches of `data.batch_size` rows, summed by a
`lax.scan` inside one jitted step (so a checkpoint never falls inside an accumulation, and
the gradient is exactly that of the whole step's mean loss), then clipped and applied by
AdamW on the warm-up + cosine schedule.

Every `eval.every` steps: the held-out loss, and held-out pass@1 (one sampled completion
per held-out problem, its code judged by the sandbox). Checkpoints every
`checkpoint.every` steps and at the end; a run started on a directory with checkpoints
resumes from the newest and reaches the same parameters, bit for bit, as a run that never
stopped (the data position is restored, and nothing random is carried between steps).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from learner.train import policy
from learner.train import state as st
from learner.train.config import ConfigError, TrainConfig
from learner.train.data import DataError, HeldOut
from learner.train.metrics import MetricsWriter, ProgressBar
from learner.train.packing import ROW_KEYS
from learner.train.prompts import PromptSource, tokenize_prompts
from learner.train.run_dir import RunDir, config_hash, open_run_dir
from learner.train.sft_data import PairCounts, SftData, pack_pairs, read_sft_pairs

KIND = "sft"


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def check_data(cfg: TrainConfig) -> None:
    """Before any compute: the pairs files exist."""
    if not cfg.data.pairs:
        raise ConfigError("data.pairs is empty: give the teacher pairs file(s) to train on")
    for path in cfg.data.pairs:
        if not Path(path).is_file():
            raise ConfigError(f"data.pairs: {path}: no such file")


def read_pairs(cfg: TrainConfig) -> tuple[list[Any], dict[str, int]]:
    """The correct pairs of every `data.pairs` file (first of each program wins), and counts
    of what was read and left out."""
    levels = cfg.data.levels or None
    pairs, seen = [], set()
    counts = {"records": 0, "not_correct": 0, "other_level": 0, "duplicates": 0}
    for path in cfg.data.pairs:
        file_pairs, file_counts = read_sft_pairs(path, levels=levels)
        counts["records"] += file_counts.records
        counts["not_correct"] += sum(file_counts.not_correct.values())
        counts["other_level"] += file_counts.other_level
        counts["duplicates"] += file_counts.duplicates
        for pair in file_pairs:
            if pair.program_id in seen:
                counts["duplicates"] += 1
                continue
            seen.add(pair.program_id)
            pairs.append(pair)
    return pairs, counts


def load_data(cfg: TrainConfig, tokenizer: Any, pairs: list[Any]) -> SftData:
    """Train rows, held-out rows and held-out prompts (split by program id)."""
    held_out = HeldOut(cfg.data.heldout_fraction, cfg.data.heldout_salt)
    train = [p for p in pairs if not held_out.contains(p.program_id)]
    kept = [p for p in pairs if held_out.contains(p.program_id)]
    pack = partial(
        pack_pairs, tokenizer=tokenizer, seq_len=cfg.data.seq_len, seed=cfg.data.seed,
        truncate=cfg.data.truncate,
    )  # fmt: skip
    prompts, _ = tokenize_prompts(
        [(p.program_id, p.level, p.ops, p.problem, p.prompt) for p in kept], tokenizer
    )
    return SftData(
        train=pack(train), held_out=pack(kept), held_out_prompts=PromptSource(prompts),
        pairs=PairCounts(records=len(pairs), correct=len(pairs)),
    )  # fmt: skip


def step_batches(cfg: TrainConfig, data: SftData) -> Any:
    """The train iterator: each item is one optimizer step's rows (grad_accum micro-batches)."""
    return data.train.batches(
        cfg.data.batch_size * cfg.optim.grad_accum,
        seed=cfg.data.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        read_threads=cfg.data.read_threads,
    )


def as_micro_batches(batch: dict[str, np.ndarray], accum: int) -> dict[str, np.ndarray]:
    """[accum * rows, L] -> [accum, rows, L] (micro-batch k = rows k*rows ... of the step)."""
    return {key: batch[key].reshape(accum, -1, *batch[key].shape[1:]) for key in ROW_KEYS}


# --------------------------------------------------------------------------------------------
# Jitted steps
# --------------------------------------------------------------------------------------------


def token_loss_sum(
    model: Any, micro: dict[str, jax.Array], chunk: int
) -> tuple[jax.Array, jax.Array]:
    """(sum of -log p over loss tokens, number of loss tokens) of a micro-batch.

    Position t predicts `targets[t]`, which the data guarantees is `tokens[t + 1]` wherever
    `loss_mask` is 1 (inside one example); other positions carry no loss.
    """
    logp = st.sequence_logprobs(
        model, micro["tokens"], micro["positions"], micro["segment_ids"], chunk=chunk
    )
    mask = micro["loss_mask"][:, :-1].astype(jnp.float32)
    return -(logp * mask).sum(), mask.sum()


def sft_step(
    state: st.TrainState, batch: dict[str, jax.Array], *, chunk: int, schedule: Any
) -> tuple[Any, Any]:
    """One optimizer step on [accum, rows, L] arrays: mean loss over the step's loss tokens."""
    denom = jnp.maximum(batch["loss_mask"][:, :, :-1].astype(jnp.float32).sum(), 1.0)

    def micro_loss(params: Any, micro: dict[str, jax.Array]) -> jax.Array:
        model = nnx.merge(state.graphdef, params)
        return token_loss_sum(model, micro, chunk)[0] / denom

    def accumulate(carry: tuple[Any, jax.Array], micro: dict[str, jax.Array]) -> Any:
        grads, loss = carry
        value, grad = jax.value_and_grad(micro_loss)(state.params, micro)
        grads = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads, grad)
        return (grads, loss + value), None

    (grads, loss), _ = jax.lax.scan(accumulate, (st.zeros_like_params(state), 0.0), batch)
    lr = schedule(state.step)
    state, stats = st.apply_gradients(state, grads)
    return state, {"loss": loss, "lr": lr, "loss_tokens": denom, **stats}


def eval_loss_step(
    state: st.TrainState, batch: dict[str, jax.Array], *, chunk: int
) -> tuple[jax.Array, jax.Array]:
    return token_loss_sum(state.model(), batch, chunk)


class SftSteps:
    """The jitted train and eval steps of one run, compiled for its mesh and shardings."""

    def __init__(self, state: st.TrainState, mesh: Any, cfg: TrainConfig) -> None:
        self.mesh = mesh
        self.shardings = st.state_shardings(state, mesh)
        chunk = cfg.model.logits_chunk
        self._train = jax.jit(
            partial(sft_step, chunk=chunk, schedule=st.lr_schedule(cfg.optim)),
            in_shardings=(self.shardings, None),
            out_shardings=(self.shardings, st.replicated(mesh)),
            donate_argnums=0,
        )
        self._eval = jax.jit(
            partial(eval_loss_step, chunk=chunk),
            in_shardings=(self.shardings, None),
            out_shardings=st.replicated(mesh),
        )

    def train(self, state: st.TrainState, batch: dict[str, np.ndarray]) -> tuple[Any, Any]:
        with jax.set_mesh(self.mesh):
            return self._train(state, st.put_batch(batch, self.mesh, axis=1))

    def eval_loss(self, state: st.TrainState, batches: Iterator[dict[str, np.ndarray]]) -> float:
        total, count = 0.0, 0.0
        with jax.set_mesh(self.mesh):
            for batch in batches:
                loss, n = self._eval(state, st.put_batch(batch, self.mesh, axis=0))
                total, count = total + float(loss), count + float(n)
        return total / count if count else float("nan")


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def needs_sandbox(cfg: TrainConfig) -> bool:
    return cfg.eval.pass_at_1_problems > 0 and (cfg.eval.every > 0 or cfg.eval.at_end)


def preflight(cfg: TrainConfig, run: RunDir) -> bool:
    """Every check that needs no compute: data files, tokenizer, model path, the run dir's
    config. Returns whether the run resumes. Raises `ConfigError`."""
    check_data(cfg)
    policy.check_tokenizer(cfg.model, run.path)
    if cfg.model.path:
        policy.qwen2_config(cfg.model)  # the directory and its shape
    return run.check()


def run_sft(cfg: TrainConfig) -> dict[str, Any]:
    """Train (or resume) the run `cfg` describes; returns a summary of the end state."""
    run = open_run_dir(cfg, KIND)
    resumes = preflight(cfg, run)
    with contextlib.ExitStack() as stack:
        client = None
        if needs_sandbox(cfg):
            from learner.train.verify import sandbox_client

            client = stack.enter_context(sandbox_client(cfg.sandbox))
        trainer = SftTrainer(cfg, run, client)
        stack.callback(trainer.close)
        return trainer.run(resumes)


class SftTrainer:
    """One SFT run: set up (fresh or resumed), then step, log, evaluate and checkpoint."""

    def __init__(self, cfg: TrainConfig, run: RunDir, client: Any = None) -> None:
        self.cfg, self.run_dir, self.client = cfg, run, client
        self.metrics = MetricsWriter(run.path, tensorboard=cfg.log.tensorboard)
        self.checkpointer = run.checkpointer()
        self._sampler: Any = None
        self.counters = {"tokens": 0, "examples_epochs": 0.0}

    def close(self) -> None:
        self.checkpointer.close()
        self.metrics.close()

    # -- setup ------------------------------------------------------------------------------

    def setup(self, resumes: bool) -> None:
        cfg = self.cfg
        try:
            pairs, self.pair_counts = read_pairs(cfg)
            texts = [p.prompt + p.completion for p in pairs] if not resumes else []
            self.tokenizer = policy.prepare_tokenizer(cfg.model, self.run_dir.path, texts)
            self.data = load_data(cfg, self.tokenizer, pairs)
        except DataError as err:
            raise ConfigError(str(err)) from None
        self.qcfg = policy.qwen2_config(cfg.model, len(self.tokenizer))
        self.mesh = st.mesh_for(cfg.mesh)
        self.batches = step_batches(cfg, self.data)
        if resumes:
            self.state = self._restore()
        else:
            self.state = st.create_train_state(cfg, self.qcfg, self.mesh)
            self.metrics.truncate_after(0)
        self.run_dir.write_config()
        self.steps = SftSteps(self.state, self.mesh, cfg)

    def _restore(self) -> st.TrainState:
        abstract, _ = st.abstract_train_state(self.cfg, self.qcfg, self.mesh)
        arrays, meta = self.checkpointer.restore(None, abstract.arrays())
        self.run_dir.check_meta(meta)
        try:
            self.batches.set_state(meta["data"])
        except (DataError, KeyError) as err:
            raise ConfigError(f"{self.run_dir.checkpoint_dir}: {err}") from None
        self.counters.update(meta.get("counters", {}))
        self.metrics.truncate_after(int(meta["step"]))
        return abstract.with_arrays(arrays)

    def _meta(self, step: int) -> dict[str, Any]:
        return {
            "kind": KIND,
            "step": step,
            "data": self.batches.get_state(),
            "counters": self.counters,
            "config_hash": config_hash(self.cfg),
        }

    # -- loop -------------------------------------------------------------------------------

    def run(self, resumes: bool) -> dict[str, Any]:
        cfg = self.cfg
        self.setup(resumes)
        start = int(jax.device_get(self.state.step))
        total = cfg.optim.total_steps
        if start == 0:
            self.metrics.write(0, self._data_summary(), "data")
        pending: list[dict[str, Any]] = []
        clock, tokens_since = time.perf_counter(), 0
        with ProgressBar(total, initial=start, enabled=cfg.log.progress, title=KIND) as bar:
            for step in range(start + 1, total + 1):
                batch = as_micro_batches(next(self.batches), cfg.optim.grad_accum)
                tokens = int((batch["segment_ids"] != 0).sum()) * jax.process_count()
                tokens_since += tokens
                self.counters["tokens"] += tokens
                self.state, out = self.steps.train(self.state, batch)
                pending.append(out)
                last = step == total
                if step % cfg.log.every == 0 or last:
                    elapsed = time.perf_counter() - clock
                    figures = self._log_train(step, pending, tokens_since / max(elapsed, 1e-9))
                    bar.update(step, figures)
                    pending, clock, tokens_since = [], time.perf_counter(), 0
                if self.checkpointer.should_save(step) or last:
                    self.checkpointer.save(step, self.state.arrays(), self._meta(step), force=last)
                    clock = time.perf_counter()  # throughput counts training time only
                if (cfg.eval.every and step % cfg.eval.every == 0) or (last and cfg.eval.at_end):
                    bar.update(step, self.evaluate(step))
                    clock = time.perf_counter()
        self.checkpointer.wait()
        if start < total:
            self.export()
        return {"step": total, "resumed_from": start if resumes else None}

    def _data_summary(self) -> dict[str, float]:
        train, held = self.data.train.counts, self.data.held_out.counts
        return {
            **{f"pairs_{key}": value for key, value in self.pair_counts.items()},
            "train_rows": train.rows,
            "train_examples": train.examples,
            "train_too_long": train.too_long,
            "train_fill": train.fill,
            "train_loss_tokens": train.loss_tokens,
            "heldout_rows": held.rows,
            "heldout_problems": len(self.data.held_out_prompts),
        }

    def _log_train(self, step: int, pending: list[Any], tokens_per_s: float) -> dict[str, float]:
        host = jax.device_get(pending)
        figures = {
            key: float(np.mean([float(m[key]) for m in host])) for key in host[-1] if key != "lr"
        }
        figures["lr"] = float(host[-1]["lr"])
        figures["tokens_per_s"] = tokens_per_s
        figures["epoch"] = self.batches.epoch
        self.metrics.write(step, figures, "train")
        return figures

    # -- evaluation -------------------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        cfg = self.cfg
        figures: dict[str, float] = {}
        if len(self.data.held_out):
            size = cfg.eval.batch_size or cfg.data.batch_size
            batches = self.data.held_out.eval_batches(
                size, process_index=jax.process_index(), process_count=jax.process_count()
            )
            if cfg.eval.heldout_batches:
                batches = (
                    b for i, b in zip(range(cfg.eval.heldout_batches), batches, strict=False)
                )
            figures["heldout_loss"] = self.steps.eval_loss(self.state, batches)
        if self.client is not None and len(self.data.held_out_prompts):
            figures.update(self._pass_at_1(step))
        if figures:
            self.metrics.write(step, figures, "eval")
        return figures

    def _pass_at_1(self, step: int) -> dict[str, float]:
        from learner.train.evaluate import heldout_pass_at_1, make_sampler

        model = self.state.model()
        if self._sampler is None:
            self._sampler = make_sampler(model, self.tokenizer, self.mesh)
        else:
            self._sampler.set_model(model)
        records = self.data.held_out_prompts[: self.cfg.eval.pass_at_1_problems]
        started = time.perf_counter()
        result, _ = heldout_pass_at_1(
            self._sampler,
            self.client,
            records,
            self.cfg.eval,
            self.cfg.sandbox,
            st.step_seed(self.cfg.seed, step, "eval"),
        )
        return {**result.metrics(), "pass_at_1_seconds": time.perf_counter() - started}

    # -- the trained model ------------------------------------------------------------------

    def export(self) -> None:
        """RUN_DIR/model: the final parameters as a model directory with the tokenizer."""
        from learner.model import io

        io.save_model(
            self.state.model(),
            self.run_dir.model_dir,
            hf_config=policy.hf_config_for(self.cfg.model, self.qcfg),
            overwrite=True,
        )
        if jax.process_index() == 0:
            self.tokenizer.save_pretrained(str(self.run_dir.model_dir))
