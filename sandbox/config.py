"""Settings of one sandbox (a server or a local verifier), with their defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass

# Comparison tolerances when the request sets none. Functional problems are fp32
# programs; KernelBench problems use KernelBench's own tolerances.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
KERNELBENCH_ATOL = 1e-2
KERNELBENCH_RTOL = 1e-2
DEFAULT_TRIALS = 5
MAX_TRIALS = 50


@dataclass(frozen=True)
class SandboxConfig:
    """How a sandbox runs jobs.

    `device="auto"` picks CUDA when a GPU is visible and Triton's CPU interpreter
    otherwise. `workers` is the number of jobs graded at once; each worker keeps one
    candidate process pre-started. A job waits in a queue of `queue_capacity`
    places; past that, requests are refused (RESOURCE_EXHAUSTED).
    """

    device: str = "auto"
    workers: int = max(1, min(4, (os.cpu_count() or 2) // 2))
    queue_capacity: int = 256
    job_timeout_s: float = 120.0
    candidate_memory_mb: int = 8192
    candidate_cpu_s: int = 600
    candidate_output_mb: int = 64
    allow_weak_isolation: bool = False
    timing_runs: int = 50
    timing_warmup: int = 5
    speedup_sanity_bound: float = 20.0
    # Where job directories live: a RAM-backed file system keeps I/O cheap.
    job_root: str = "/dev/shm/drtriton-jobs" if os.path.isdir("/dev/shm") else "/tmp/drtriton-jobs"


def resolve_device(device: str) -> str:
    """Turn "auto" into "cuda" or "cpu"; reject anything else."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: expected auto, cpu or cuda")
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
