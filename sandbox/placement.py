"""Which GPU each grader worker of a server uses.

Every candidate runs in a fresh process that creates its own CUDA context, and one GPU's
driver creates about four contexts a second however many processes ask at once
(`bench.cuda_startup`): that, not the kernels, bounds one GPU's verifications per second.
A server on a host with several GPUs therefore spreads its workers over them, round
robin, each worker seeing only its own GPU (`CUDA_VISIBLE_DEVICES`), and each GPU's
workers keeping their own job root: the timing gate and the GPU memory budget are per GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def visible_gpus() -> list[str]:
    """The GPUs this process may use, each named as a child's `CUDA_VISIBLE_DEVICES` takes it."""
    import torch

    count = torch.cuda.device_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


def choose_gpus(requested: Sequence[int], visible: Sequence[str]) -> list[str]:
    """The GPUs to use: `requested` indices into `visible`, or every visible one."""
    if not visible:
        raise ValueError("no GPU is visible to this process")
    if not requested:
        return list(visible)
    if len(set(requested)) != len(requested):
        raise ValueError(f"GPU indices repeat in {list(requested)}")
    if bad := [i for i in requested if not 0 <= i < len(visible)]:
        raise ValueError(
            f"GPU index {bad[0]} is out of range: {len(visible)} GPU(s) visible (0-{len(visible) - 1})"
        )
    return [visible[i] for i in requested]


def spread(workers: int, gpus: Sequence[str]) -> list[tuple[str, int]]:
    """(GPU, its number of workers), round robin; GPUs beyond `workers` get none."""
    return [
        (gpu, count) for i, gpu in enumerate(gpus) if (count := len(range(i, workers, len(gpus))))
    ]
