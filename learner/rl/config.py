"""The `rl` section of the training configuration: algorithm, sampling, rewards, curriculum.

Nested into `learner.train.config.TrainConfig` as `cfg.rl`; set from the command line as
`--set rl.key=value`. Defaults are the paper's: G = 8 samples per prompt, DRPO with
β, τ, λ, δ = 100, 5, 0.1, 0.001 and the log speed reward.

`PRESETS` adds RL values to the training presets of the same name; `RESUME_MUTABLE` lists the
keys a resumed run may change (none of them alters the parameters' trajectory).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from learner.rl.algorithms import ALGORITHMS
from learner.rl.drpo import DRPOConfig
from learner.rl.grpo import GRPOConfig
from learner.rl.rewards import POWER_ALPHAS, SPEED_REWARD_KINDS, RewardConfig


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """One RL run's knobs (see the module docstring).

    Per step `prompts_per_step` prompts x `group_size` samples at `temperature` / `top_p`,
    at most `max_new_tokens` each (a completion cut there is masked and counted).
    `overlap`: verify step k in a background thread while step k+1 is sampled (one step
    off-policy); "auto" = on for GPU/TPU, off on CPU.
    `max_logprob_gap`: fail the run when the trainer's recomputed behaviour log-probs differ
    from the sampler's by more than this (absolute, per token; 0 = never check). In float32
    the two agree to ~1e-5; bfloat16 compute rounds logits by up to a few tenths of a nat on
    rare tokens, hence the GPU preset's looser bound. A misaligned layout costs nats.
    `gpu_gate_dir`: the sandbox host's GPU gate directory (its job root); the learner holds a
    shared hold around its own GPU work so no timed loop runs beside it; "" = off, "auto" =
    the local sandbox's job root when it runs on the same GPU.
    Curriculum: `levels` in order; every `eval_every` steps held-out pass@1 at the current
    level over `eval_problems` prompts (greedy); promote when it exceeds `promote_at`; at the
    last level stop when the best pass@1 has not improved for `plateau_patience` evaluations
    (0 = never stop on a plateau). `max_steps` bounds the run (0 = `optim.total_steps`).
    `cache_size`: verdicts kept for identical (problem, candidate) pairs (0 = no cache);
    a timed one is served once the kernel has `timings_per_kernel` speedups (their median).
    The policy starts from `model.path` (an SFT run's saved model directory).
    """

    algorithm: str = "drpo"
    prompts_per_step: int = 4
    group_size: int = 8
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    # DRPO (paper values)
    drpo_beta: float = 100.0
    drpo_tau: float = 5.0
    drpo_lam: float = 0.1
    drpo_delta: float = 0.001
    drpo_kl_estimator: str = "k3"
    # GRPO (baseline)
    grpo_clip_eps: float = 0.2
    grpo_kl_coef: float = 0.04
    grpo_speed_weight: float = 0.2
    grpo_adv_eps: float = 1e-4
    # Speed reward: "log" or "power" (alpha in POWER_ALPHAS)
    reward_kind: str = "log"
    reward_alpha: float = 0.5
    # Throughput and safety
    overlap: str = "auto"
    max_logprob_gap: float = 0.05
    gpu_gate_dir: str = ""
    cache_size: int = 65536
    timings_per_kernel: int = 3
    # Curriculum
    levels: tuple[int, ...] = (1, 2, 5)
    promote_at: float = 0.5
    eval_every: int = 50
    eval_problems: int = 32
    plateau_patience: int = 3
    max_steps: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.algorithm in ALGORITHMS, f"rl.algorithm must be one of {sorted(ALGORITHMS)}"),
            (self.prompts_per_step >= 1, "rl.prompts_per_step must be at least 1"),
            (self.group_size >= 2, "rl.group_size must be at least 2"),
            (self.max_new_tokens >= 1, "rl.max_new_tokens must be at least 1"),
            (self.temperature >= 0, "rl.temperature must be >= 0"),
            (0 < self.top_p <= 1, "rl.top_p must be in (0, 1]"),
            (
                self.reward_kind in SPEED_REWARD_KINDS,
                f"rl.reward_kind: one of {SPEED_REWARD_KINDS}",
            ),
            (self.reward_alpha in POWER_ALPHAS, f"rl.reward_alpha: one of {POWER_ALPHAS}"),
            (self.overlap in ("auto", "on", "off"), "rl.overlap must be auto, on or off"),
            (self.max_logprob_gap >= 0, "rl.max_logprob_gap must be >= 0"),
            (self.cache_size >= 0, "rl.cache_size must be >= 0"),
            (self.timings_per_kernel >= 1, "rl.timings_per_kernel must be at least 1"),
            (bool(self.levels), "rl.levels must name at least one level"),
            (all(level >= 1 for level in self.levels), "rl.levels must be positive"),
            (0 <= self.promote_at <= 1, "rl.promote_at must be in [0, 1]"),
            (self.eval_every >= 0, "rl.eval_every must be >= 0"),
            (self.eval_problems >= 0, "rl.eval_problems must be >= 0"),
            (self.plateau_patience >= 0, "rl.plateau_patience must be >= 0"),
            (self.max_steps >= 0, "rl.max_steps must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.loss_config()  # the algorithm's own checks, now rather than at the first step

    def loss_config(self) -> DRPOConfig | GRPOConfig:
        """The frozen config the chosen algorithm's loss takes."""
        if self.algorithm == "drpo":
            return DRPOConfig(
                beta=self.drpo_beta,
                tau=self.drpo_tau,
                lam=self.drpo_lam,
                delta=self.drpo_delta,
                kl_estimator=self.drpo_kl_estimator,
            )
        return GRPOConfig(
            clip_eps=self.grpo_clip_eps,
            kl_coef=self.grpo_kl_coef,
            speed_weight=self.grpo_speed_weight,
            adv_eps=self.grpo_adv_eps,
        )

    def reward_config(self) -> RewardConfig:
        return RewardConfig(kind=self.reward_kind, alpha=self.reward_alpha)

    def overlap_enabled(self, platform: str) -> bool:
        """Whether to verify step k while sampling step k+1 on this JAX platform."""
        if self.overlap == "auto":
            return platform != "cpu"
        return self.overlap == "on"


# RL values added to the training presets of the same name.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-cpu": {
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 256,
        "eval_every": 10,
        "eval_problems": 4,
        "cache_size": 4096,
    },
    "100m-gpu": {
        "prompts_per_step": 16,
        "group_size": 8,
        "max_new_tokens": 1024,
        "max_logprob_gap": 1.0,
        "eval_every": 25,
        "eval_problems": 128,
        "gpu_gate_dir": "auto",
    },
    "7b-cluster": {
        "prompts_per_step": 64,
        "group_size": 8,
        "max_new_tokens": 2048,
        "max_logprob_gap": 1.0,
        "eval_every": 50,
        "eval_problems": 512,
    },
}

# Keys under `rl.` a resumed run may change.
RESUME_MUTABLE: tuple[str, ...] = ("max_steps", "gpu_gate_dir")
