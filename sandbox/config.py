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
    # What a candidate may write into its job directory (a tmpfs of its own where the grader
    # may mount), beyond the grader's own files there, which are sized from the job's I/O.
    candidate_job_dir_mb: int = 1024
    allow_weak_isolation: bool = False
    timing_runs: int = 50
    timing_warmup: int = 5
    speedup_sanity_bound: float = 20.0
    job_root: str = field(default_factory=default_job_root)
    gpus: tuple[int, ...] = ()
    # Tests of the layers behind the static gate switch it off; no request can.
    static_gate: bool = True


def resolve_device(device: str) -> str:
    """Turn "auto" into "cuda" or "cpu"; reject anything else."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: expected auto, cpu or cuda")
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# Problem and candidate together, per request: twice the largest single source a grader takes.
DEFAULT_MAX_REQUEST_SOURCE_BYTES = 4 * 2**20


@dataclass(frozen=True)
class ServerConfig:
    """How a server meets its clients (the sandbox behind it is a `SandboxConfig`).

    Paths, not contents: `sandbox.auth` reads them at start, so a missing or malformed file
    refuses to serve. A non-loopback `host` needs `tls_cert`/`tls_key` and a token source
    (`token_file` or `token_env`) unless `insecure`. `tls_client_ca` asks every client for a
    certificate signed by it (mutual TLS). `max_in_flight_per_client` (0: no limit) counts a
    client's jobs being graded or queued at once; `max_source_bytes` bounds problem and
    candidate together; `audit_log` (a JSONL file) records every finished request.
    """

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    token_file: str | None = None
    token_env: str | None = None
    insecure: bool = False
    max_in_flight_per_client: int = 0
    max_source_bytes: int = DEFAULT_MAX_REQUEST_SOURCE_BYTES
    audit_log: str | None = None
