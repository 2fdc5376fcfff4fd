"""Settings of one sandbox (a server or a local verifier), with their defaults."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field

# Comparison tolerances when the request sets none. Functional problems are fp32
# programs; KernelBench problems use KernelBench's own tolerances.
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
KERNELBENCH_ATOL = 1e-2
KERNELBENCH_RTOL = 1e-2
DEFAULT_TRIALS = 5
MAX_TRIALS = 50


def default_job_root(min_free_bytes: int = 8 * 2**30) -> str:
    """Where job directories live: RAM-backed /dev/shm keeps I/O cheap, if it has room."""
    with contextlib.suppress(OSError):
        if shutil.disk_usage("/dev/shm").free >= min_free_bytes:
            return "/dev/shm/drtriton-jobs"
    return os.path.join(tempfile.gettempdir(), "drtriton-jobs")


@dataclass(frozen=True)
class SandboxConfig:
    """How a sandbox runs jobs.

    `device="auto"` picks CUDA when a GPU is visible and Triton's CPU interpreter
    otherwise. `workers` is the number of jobs graded at once; each worker keeps `spares`
    candidate processes started ahead (on a GPU each holds a CUDA context and the timing
    clock's 256 MiB L2-flush buffer, and takes most of a second to start on a busy host:
    a second one gives it twice the time, when jobs wait for theirs). A job waits in a
    queue of `queue_capacity` places; past that, requests are refused (RESOURCE_EXHAUSTED). On a host with
    several GPUs the workers spread over `gpus` (indices among the visible GPUs; empty:
    all of them), round robin (`sandbox.placement`).
    """

    device: str = "auto"
    workers: int = max(1, min(8, (os.cpu_count() or 2) // 2))  # 8 verified fastest on an H200
    spares: int = 1
    queue_capacity: int = 256
    job_timeout_s: float = 120.0
    candidate_memory_mb: int = 8192
    candidate_cpu_s: int = 600
    candidate_output_mb: int = 64
    allow_weak_isolation: bool = False
    timing_runs: int = 50
    timing_warmup: int = 5
    speedup_sanity_bound: float = 20.0
    job_root: str = field(default_factory=default_job_root)
    gpus: tuple[int, ...] = ()


def resolve_device(device: str) -> str:
    """Turn "auto" into "cuda" or "cpu"; reject anything else."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: expected auto, cpu or cuda")
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
