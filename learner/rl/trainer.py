"""The RL trainer: `run_rl(cfg)`, called by `drtriton train rl`.

One step s (B prompts x G samples, `cfg.rl`):

1. prompts: the next batch of the current curriculum level's training programs
   (`PromptStream`, an exact, checkpointable position per level);
2. sample: the sampler draws G completions per prompt with per-token log-probs of the
   behaviour policy; seeds come from (run seed, step), so a step is re-made exactly;
3. verify (background thread): code extracted, unparsable and truncated answers not sent,
   identical (problem, candidate) pairs answered from the cache, the rest judged by the
   sandbox fleet (`RewardClient`); sandbox failures are masked, never scored wrong;
4. update (`learner.rl.update`): the current policy's log-probs recomputed, DRPO or GRPO,
   one optimizer step (over `optim.grad_accum` micro-batches of whole prompt groups, with
   exactly the full batch's gradient); the gap between the trainer's and the sampler's log-probs of the
   behaviour policy is logged and bounded (`rl.max_logprob_gap`);
5. every `rl.eval_every` steps: held-out pass@1 at the current level (greedy, same verify
   path) feeds the curriculum (promote, or stop on a plateau at the last level);
6. metrics, progress, and a checkpoint every `checkpoint.every` steps.

Overlap (`rl.overlap`): while step s is verified, step s+1 is sampled with the parameters
before update s (one step off-policy; DRPO's KL and GRPO's ratio are taken against those
parameters, which drew the samples). The pipeline drains (step s+1 sampled on-policy
after update s) whenever s is a checkpoint or evaluation step: a resumed run then re-makes
exactly the rollouts of an uninterrupted one, since nothing is in flight at a checkpoint.
Rollouts in flight when a run is killed are simply lost and re-made from (seed, step).

Exactness of a resumed run needs the same verdicts: on the CPU sandbox they are a function
of the candidate (fixed input seed per problem, no timing). The verdict cache is not
checkpointed (a hit equals a fresh verdict on CPU; on a GPU speedups vary anyway).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from learner.generate.sampler import Sampler, SamplingParams
from learner.model import io
from learner.rl.cache import VerdictCache
from learner.rl.common import RLBatch
from learner.rl.curriculum import Curriculum
from learner.rl.gpu_share import GpuShare, NoShare, open_share
from learner.rl.report import TOTALS, add_totals, step_figures
from learner.rl.reward_client import RewardClient, VerifyStats
from learner.rl.rollout import Assembled, Rollout, assemble, prompt_width, requests, sample_rollout
from learner.rl.update import make_rl_step
from learner.train import policy
from learner.train.config import ConfigError, TrainConfig
from learner.train.data import HeldOut, eos_id, pad_id
from learner.train.metrics import MetricsWriter, ProgressBar
from learner.train.prompts import PromptSource
from learner.train.run_dir import RunDir, config_hash, open_run_dir
from learner.train.state import (
    TrainState,
    abstract_train_state,
    create_train_state,
    mesh_for,
    state_shardings,
    step_seed,
)

log = logging.getLogger("drtriton.learner.rl")

KIND = "rl"


class LogprobGapError(RuntimeError):
    """The trainer's log-probs of the behaviour policy disagree with the sampler's."""


def check_logprob_gap(step: int, metrics: dict[str, Any], bound: float) -> None:
    """Fail the run when the update's `logprob_gap_max` exceeds `bound` (0 = no check)."""
    gap = float(metrics["logprob_gap_max"])
    if bound > 0 and not gap <= bound:
        raise LogprobGapError(
            f"step {step}: the trainer's log-probs of the sampling policy differ from the "
            f"sampler's by up to {gap:.4g} (mean {float(metrics['logprob_gap_mean']):.4g}), "
            f"above rl.max_logprob_gap={bound}: the objective would be computed on the wrong "
            "probabilities (check dtypes, padding and positions)"
        )


class SandboxStarvedError(RuntimeError):
    """Most samples went unjudged (masked) step after step: the run would learn nothing."""


# A step with this share of its samples unjudged counts as starved; this many in a row stop.
STARVED_SHARE = 0.5
STARVED_STEPS = 3


def starved_streak(streak: int, counts: dict[str, Any], step: int) -> int:
    """The run of consecutive starved steps after this one; raises at STARVED_STEPS."""
    samples = float(counts.get("samples", 0))
    unjudged = float(counts.get("sandbox_failures", 0))
    streak = streak + 1 if samples and unjudged / samples >= STARVED_SHARE else 0
    if streak >= STARVED_STEPS:
        raise SandboxStarvedError(
            f"step {step}: the sandbox could not judge {unjudged:.0f} of {samples:.0f} samples, "
            f"and at least half in each of the last {STARVED_STEPS} steps: masked samples teach "
            "nothing (the reasons are in the log: an unreachable fleet, refused requests, "
            "deadlines too short for the queue)"
        )
    return streak


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------


def load_prompts(cfg: TrainConfig, tokenizer: Any) -> tuple[dict[int, Any], dict[int, Any]]:
    """Training and held-out prompts of every curriculum level (clear errors when missing)."""
    held_out = HeldOut(cfg.data.heldout_fraction, cfg.data.heldout_salt)
    levels = cfg.rl.levels

    def read(split: str) -> dict[int, Any]:
        source = PromptSource.from_programs(
            cfg.data.programs, tokenizer, levels=levels, split=split, held_out=held_out
        )
        return {level: source.at_levels(level) for level in levels}

    train, evaluation = read("train"), read("held_out")
    for level in levels:
        if not len(train[level]):
            raise ConfigError(
                f"data.programs hold no training programs of level {level} (see rl.levels)"
            )
        if cfg.rl.eval_every and cfg.rl.eval_problems and not len(evaluation[level]):
            raise ConfigError(
                f"data.programs hold no held-out programs of level {level} "
                "(raise data.heldout_fraction, or set rl.eval_every=0)"
            )
    return train, evaluation


class PromptStream:
    """Batches of the current level's training prompts; one exact position per level."""

    def __init__(self, sources: dict[int, Any], batch_size: int, seed: int) -> None:
        self.sources = sources
        self.batch_size = batch_size
        self.seed = seed
        self._iterators: dict[int, Any] = {}

    def _iterator(self, level: int) -> Any:
        if level not in self._iterators:
            seed = (self.seed + 7919 * level) % 2**32
            self._iterators[level] = self.sources[level].batches(self.batch_size, seed=seed)
        return self._iterators[level]

    def next(self, level: int) -> list[Any]:
        return next(self._iterator(level))

    def state(self, level: int) -> dict[str, Any]:
        return {"level": level, "iterator": self._iterator(level).get_state()}

    def restore(self, saved: dict[str, Any]) -> None:
        self._iterator(int(saved["level"])).set_state(saved["iterator"])


# --------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Verified:
    records: list[dict[str, Any]]
    stats: VerifyStats


class RLTrainer:
    """Owns the state of one RL run; `run()` trains until the last step or a plateau."""

    def __init__(
        self,
        cfg: TrainConfig,
        run: RunDir,
        tokenizer: Any,
        prompts: tuple[dict[int, Any], dict[int, Any]],
        reward: RewardClient,
        share: GpuShare | NoShare,
    ) -> None:
        self.cfg, self.run_dir, self.tokenizer = cfg, run, tokenizer
        self.rl = cfg.rl
        self.train_prompts, self.eval_prompts = prompts
        self.stream = PromptStream(self.train_prompts, self.rl.prompts_per_step, cfg.data.seed)
        self.reward, self.share = reward, share
        self.mesh = mesh_for(cfg.mesh)
        self.overlap = self.rl.overlap_enabled(jax.default_backend())
        self.max_steps = self.rl.max_steps or cfg.optim.total_steps
        self.loss_config = self.rl.loss_config()
        self.reward_config = self.rl.reward_config()
        self.widths = {lv: prompt_width(src) for lv, src in self.train_prompts.items()}
        self.sampling = SamplingParams(
            max_new_tokens=self.rl.max_new_tokens,
            temperature=self.rl.temperature,
            top_p=self.rl.top_p,
        )
        self.pad_id = pad_id(tokenizer)
        self.curriculum = Curriculum(self.rl.levels, self.rl.promote_at, self.rl.plateau_patience)
        self.totals: dict[str, float] = dict.fromkeys(TOTALS, 0.0)
        self.starved = 0  # consecutive steps with most samples unjudged
        self.last_pass: float = math.nan
        self.checkpointer = run.checkpointer()
        self.state, self.start_step = self._start()
        self.version = self.start_step  # updates applied to the parameters so far
        self.reference = self._reference_params()
        self.shardings = state_shardings(self.state, self.mesh)
        self._steps: dict[tuple[int, bool, bool], Any] = {}
        self.sampler = Sampler(
            nnx.merge(self.state.graphdef, self.state.params),
            tokenizer,
            eos_ids=[eos_id(tokenizer)],
            mesh=self.mesh,
            pad_id=self.pad_id,
        )

    # -- state ------------------------------------------------------------------------------

    def _start(self) -> tuple[TrainState, int]:
        cfg = self.cfg
        qcfg = policy.qwen2_config(cfg.model, len(self.tokenizer))
        self.qcfg = qcfg
        step = self.checkpointer.latest_step()
        if step is None:
            return create_train_state(cfg, qcfg, self.mesh), 0
        abstract, _ = abstract_train_state(cfg, qcfg, self.mesh)
        arrays, meta = self.checkpointer.restore(step, abstract.arrays())
        self.run_dir.check_meta(meta)
        self._restore_meta(meta)
        return abstract.with_arrays(arrays), step

    def _meta(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "prompts": self.stream.state(self.curriculum.level),
            "curriculum": self.curriculum.to_dict(),
            "totals": self.totals,
            "last_pass_at_1": None if math.isnan(self.last_pass) else self.last_pass,
            "schedule": self._schedule(),
            "config_hash": config_hash(self.cfg),
        }

    def _schedule(self) -> dict[str, Any]:
        """What decides which steps are sampled one step off-policy."""
        return {"overlap": self.overlap, "drain_every": self.cfg.checkpoint.every}

    def _restore_meta(self, meta: dict[str, Any]) -> None:
        try:
            curriculum = Curriculum.from_dict(meta["curriculum"])
            curriculum.check_settings(self.rl.levels, self.rl.promote_at, self.rl.plateau_patience)
        except (KeyError, ValueError) as err:
            raise ConfigError(f"{self.run_dir.checkpoint_dir}: {err}") from None
        saved, current = meta.get("schedule") or {}, self._schedule()
        if saved != current and (saved.get("overlap") or current["overlap"]):
            raise ConfigError(
                f"this run was checkpointed with the rollout schedule {saved}, this one would "
                f"use {current}: with rl.overlap on, which steps are sampled one update behind "
                "depends on checkpoint.every and on the platform (overlap=auto); keep both"
            )
        self.curriculum = curriculum
        self.stream.restore(meta["prompts"])
        self.totals = {k: float(meta.get("totals", {}).get(k, 0.0)) for k in TOTALS}
        last = meta.get("last_pass_at_1")
        self.last_pass = math.nan if last is None else float(last)

    def _reference_params(self) -> Any:
        """GRPO's reference policy (the starting parameters), when its KL is on."""
        if self.rl.algorithm != "grpo" or self.rl.grpo_kl_coef <= 0:
            return None
        model = policy.build_model(self.cfg.model, self.qcfg, seed=self.cfg.seed, mesh=self.mesh)
        return nnx.split(model)[1]

    def save(self, step: int, *, force: bool = False) -> None:
        self.checkpointer.save(step, self.state.arrays(), self._meta(), force=force)

    # -- phases -----------------------------------------------------------------------------

    def sample(self, step: int) -> Rollout:
        level = self.curriculum.level
        prompts = self.stream.next(level)
        with self.share.hold():
            rollout = sample_rollout(
                self.sampler,
                prompts,
                step=step,
                seed=step_seed(self.cfg.seed, step, "rollout"),
                group_size=self.rl.group_size,
                sampling=self.sampling,
                width=self.widths[level],
                pad_id=self.pad_id,
            )
        rollout.behaviour, rollout.params_step = self.state.params, self.version
        return rollout

    def judge(self, rollout: Rollout) -> Verified:
        """Runs in the verifier thread (process 0 only on several hosts)."""
        if jax.process_index() != 0:
            return Verified([], VerifyStats())
        return Verified(*self.reward.judge(requests(rollout)))

    def update(self, rollout: Rollout, assembled: Assembled, *, donate: bool) -> dict[str, Any]:
        on_policy = rollout.params_step == self.version
        step_fn = self._step_fn(
            rollout.prompt_width, donate=donate and on_policy, ahead=not on_policy
        )
        batch = RLBatch(*(self._put(np.asarray(x)) for x in assembled.batch[:5]))
        tokens, starts = self._put(assembled.tokens), self._put(assembled.starts)
        behaviour = None if on_policy else rollout.behaviour
        with self.share.hold(), jax.set_mesh(self.mesh):
            state, metrics = step_fn(self.state, batch, tokens, starts, behaviour, self.reference)
            metrics = jax.device_get(metrics)
        self.state = state
        self.sampler.state = state.params
        metrics["off_policy"] = 0.0 if on_policy else 1.0
        return metrics

    def _step_fn(self, width: int, *, donate: bool, ahead: bool) -> Any:
        """The compiled update for a prompt width (one per width and variant, kept)."""
        key = (width, donate, ahead)
        if key not in self._steps:
            self._steps[key] = make_rl_step(
                self.shardings,
                width=width,
                algorithm=self.rl.algorithm,
                loss_config=self.loss_config,
                chunk=self.cfg.model.logits_chunk,
                donate=donate,
                behaviour=ahead,
                reference=self.reference is not None,
                accum=self.cfg.optim.grad_accum,
            )
        return self._steps[key]

    def _put(self, x: np.ndarray) -> jax.Array:
        """A host array, the same on every host, as a global array split along its rows."""
        from learner.sharding import batch_sharding

        sharding = batch_sharding(self.mesh, x.shape)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    def evaluate(self) -> dict[str, float]:
        """Held-out pass@1 at the current level: one greedy answer per problem."""
        level = self.curriculum.level
        prompts = list(self.eval_prompts[level])[: self.rl.eval_problems]
        if not prompts:
            return {}
        started = time.perf_counter()
        with self.share.hold():
            rollout = sample_rollout(
                self.sampler,
                prompts,
                step=0,
                seed=0,
                group_size=1,
                sampling=dataclasses.replace(self.sampling, temperature=0.0),
                width=prompt_width(prompts),
                pad_id=self.pad_id,
            )
        verified = self.judge(rollout)
        records = _shared_records(verified.records, len(prompts))
        truncated = rollout.truncated.ravel()
        judged = [r["verdict"] != "sandbox_error" for r in records]
        correct = [
            r["verdict"] == "correct" and not cut for r, cut in zip(records, truncated, strict=True)
        ]
        n_judged = sum(judged)
        rate = sum(correct) / n_judged if n_judged else math.nan
        return {
            "pass_at_1": rate,
            "pass_at_1_judged": float(n_judged),
            "pass_at_1_level": float(level),
            "time_eval_s": time.perf_counter() - started,
        }

    # -- the loop ---------------------------------------------------------------------------

    def drains_after(self, step: int) -> bool:
        """No rollout is sampled ahead across a checkpoint, an evaluation or the end."""
        return (
            step % self.cfg.checkpoint.every == 0
            or self._evaluates_at(step)
            or step >= self.max_steps
        )

    def _evaluates_at(self, step: int) -> bool:
        return bool(self.rl.eval_every and self.rl.eval_problems and step % self.rl.eval_every == 0)

    def _eval_and_advance(self, step: int) -> dict[str, float]:
        figures = self.evaluate()
        rate = figures.get("pass_at_1", math.nan)
        if not math.isnan(rate):
            self.last_pass = rate
            before = self.curriculum.level
            self.curriculum = self.curriculum.record(step, rate)
            if self.curriculum.level != before:
                log.info("step %d: pass@1 %.3f at level %d: promoted", step, rate, before)
        return figures

    def run(self) -> dict[str, Any]:
        """Train to `max_steps` (or a plateau); returns a summary of the run."""
        metrics = MetricsWriter(self.run_dir.path, tensorboard=self.cfg.log.tensorboard)
        metrics.truncate_after(self.start_step if self.start_step else -1)
        bar = ProgressBar(
            self.max_steps, initial=self.start_step, enabled=self.cfg.log.progress, title="rl"
        )
        step = self.start_step
        try:
            with metrics, bar, _verifier() as verifier:
                if self.start_step == 0 and self._evaluates_at(0):
                    figures = {**self._eval_and_advance(0), "level": float(self.curriculum.level)}
                    metrics.write(0, figures, KIND)
                    bar.update(0, figures)
                pending: tuple[Rollout, Future[Verified]] | None = None
                while step < self.max_steps and not self.curriculum.done:
                    step, pending = self._one_step(step + 1, pending, verifier, metrics, bar)
            self.save(step, force=True)
        finally:
            self.checkpointer.close()
        self._save_model()
        return {
            "steps": step,
            "level": self.curriculum.level,
            "stopped": self.curriculum.stopped or "max_steps",
            "pass_at_1": self.last_pass,
            "totals": self.totals,
        }

    def _one_step(
        self,
        step: int,
        pending: tuple[Rollout, Future[Verified]] | None,
        verifier: ThreadPoolExecutor,
        metrics: MetricsWriter,
        bar: ProgressBar,
    ) -> tuple[int, tuple[Rollout, Future[Verified]] | None]:
        started = time.perf_counter()
        if pending is None:
            rollout = self.sample(step)
            future = verifier.submit(self.judge, rollout)
        else:
            rollout, future = pending
        ahead = None
        if self.overlap and not self.drains_after(step):
            upcoming = self.sample(step + 1)
            ahead = (upcoming, verifier.submit(self.judge, upcoming))
        wait_from = time.perf_counter()
        verified = future.result()
        waiting = time.perf_counter() - wait_from
        records = _shared_records(verified.records, len(rollout.texts))
        assembled = assemble(rollout, records, self.reward_config)
        update_from = time.perf_counter()
        result = self.update(rollout, assembled, donate=ahead is None)
        self.version += 1
        update_s = time.perf_counter() - update_from
        check_logprob_gap(step, result, self.rl.max_logprob_gap)
        self.totals = add_totals(self.totals, assembled.counts)
        self.starved = starved_streak(self.starved, assembled.counts, step)
        times = {
            "sampling": rollout.sample_seconds,
            "verification": verified.stats.seconds,
            "update": update_s,
            "waiting": waiting,
        }
        figures = step_figures(assembled, result, times, verified.stats.seconds)
        if self._evaluates_at(step):
            figures.update(self._eval_and_advance(step))
        figures["level"] = float(self.curriculum.level)
        figures["time_step_s"] = time.perf_counter() - started
        figures["cache_entries"] = float(len(self.reward.cache))
        metrics.write(step, figures, KIND)
        bar.update(step, figures)
        if self.curriculum.done:
            return step, None
        self.save(step)
        return step, ahead

    def _save_model(self) -> None:
        out = self.run_dir.model_dir
        model = nnx.merge(self.state.graphdef, self.state.params)
        io.save_model(
            model, out, hf_config=policy.hf_config_for(self.cfg.model, self.qcfg), overwrite=True
        )
        if jax.process_index() == 0:
            self.tokenizer.save_pretrained(str(out))


@contextlib.contextmanager
def _verifier() -> Iterator[ThreadPoolExecutor]:
    """One background thread: verifications run in step order (the cache sees them so)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rl-verify")
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _shared_records(records: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """Process 0's verdicts on every host (one host: as they are)."""
    if jax.process_count() == 1:
        return records
    from jax.experimental import multihost_utils

    from learner.rl.rewards import VERDICTS

    names = sorted(VERDICTS)
    sources = ("sandbox", "cache", "rejected")
    codes = np.zeros((count, 3), np.float64)
    if jax.process_index() == 0:
        for i, r in enumerate(records):
            speedup = r.get("speedup_vs_eager")
            codes[i] = (
                names.index(r["verdict"]),
                math.nan if speedup is None else speedup,
                sources.index(r.get("source", "sandbox")),
            )
    codes = np.asarray(multihost_utils.broadcast_one_to_all(codes))
    return [
        {
            "verdict": names[int(v)],
            "speedup_vs_eager": None if math.isnan(s) else float(s),
            "source": sources[int(src)],
        }
        for v, s, src in codes
    ]


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def rl_config(cfg: TrainConfig) -> TrainConfig:
    """RL starts from a trained policy and reads its tokenizer: `model.tokenizer = "bpe"`
    (train one, the presets' SFT setting) stands for the one in `model.path`."""
    if cfg.model.tokenizer == "bpe" and cfg.model.path:
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, tokenizer=""))
    return cfg


def check_config(cfg: TrainConfig) -> None:
    """The checks that need no data read and no compute."""
    accum, prompts = cfg.optim.grad_accum, cfg.rl.prompts_per_step
    if prompts % accum:
        raise ConfigError(
            f"optim.grad_accum={accum} must divide rl.prompts_per_step={prompts}: RL "
            "micro-batches hold whole prompt groups"
        )
    if not cfg.model.path:
        raise ConfigError(
            "model.path: RL starts from a trained policy; set it to an SFT run's model "
            "directory (RUN_DIR/model)"
        )
    missing = [p for p in cfg.data.programs if not Path(p).is_file()]
    if not cfg.data.programs or missing:
        raise ConfigError(
            "data.programs: RL reads `drtriton synth generate` files; "
            + (f"no such file: {', '.join(missing)}" if missing else "none given")
        )


def run_rl(cfg: TrainConfig) -> dict[str, Any]:
    """Train a policy with RL as `cfg` says (resuming from RUN_DIR's newest checkpoint).

    Errors before any compute: `ConfigError` (config, data, tokenizer, a resume with another
    config), `learner.train.verify.SandboxUnreachable` (no sandbox serving).
    """
    from learner.train.verify import sandbox_client

    cfg = rl_config(cfg)
    check_config(cfg)
    run = open_run_dir(cfg, KIND)
    run.check()
    policy.check_tokenizer(cfg.model, run.path)
    tokenizer = policy.prepare_tokenizer(cfg.model, run.path)
    prompts = load_prompts(cfg, tokenizer)
    with sandbox_client(cfg.sandbox) as client:
        share = open_share(cfg.rl.gpu_gate_dir)
        reward = RewardClient(
            client,
            trials=cfg.sandbox.trials,
            timing=cfg.sandbox.timing,
            concurrency=cfg.sandbox.concurrency,
            seed=cfg.seed,
            cache=VerdictCache(cfg.rl.cache_size, cfg.rl.timings_per_kernel),
        )
        if not cfg.sandbox.timing:
            log.warning("sandbox.timing is off: correct kernels get speedup 1 (r_s = 0)")
        run.write_config()
        trainer = RLTrainer(cfg, run, tokenizer, prompts, reward, share)
        return trainer.run()
