"""How other processes slow one process's timed loop on a shared GPU.

    python -m bench.context_contention --contexts 0,8,16 --modes idle,busy,churn,cpu

A sandbox host keeps many processes with CUDA contexts (graders, the candidate of
each job, a spare per worker) and starts and ends one per job. This measures the
sandbox's timed loop (L2 flush, busy-wait cover, start event, small kernel, end event,
device sync: `sandbox.timing`) in one process while N other processes each do one
thing: `idle` (hold a context, asleep), `busy` (launch small kernels in a loop),
`churn` (fork children that create a context, take memory and exit, as candidates
do) or `cpu` (spin on the CPU, no GPU). The row with no others is the baseline,
measured in the same command.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

MODES = ("idle", "busy", "churn", "cpu")


def _short_lived_context() -> None:
    """A candidate's life in brief: create a context, take memory, exit."""
    import torch

    torch.cuda.init()
    torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    os._exit(0)


def _other(ready: Any, stop: Any, mode: str) -> None:
    import torch  # before any fork: children start with it imported, like the zygote's

    if mode in ("idle", "busy"):
        torch.cuda.init()
        x = torch.empty(1 << 20, device="cuda")
        torch.cuda.synchronize()
    ready.release()
    while not stop.is_set():
        if mode == "busy":
            x.mul_(1.0001)
            torch.cuda.synchronize()
        elif mode == "churn":
            pid = os.fork()
            if pid == 0:
                _short_lived_context()
            os.waitpid(pid, 0)
        elif mode == "cpu":
            deadline = time.monotonic() + 0.05
            while time.monotonic() < deadline:
                pass
        else:
            time.sleep(0.05)


def _timed_loop(runs: int) -> tuple[float, float]:
    """(wall seconds of the loop, median event ms of one kernel)."""
    import torch

    from sandbox.timing import bind_clock, time_cuda

    clock = bind_clock()
    x = torch.randn(1 << 20, device="cuda")
    out = torch.empty_like(x)
    time_cuda(lambda: torch.mul(x, 2.0, out=out), clock, 5, 5)
    started = time.perf_counter()
    times = time_cuda(lambda: torch.mul(x, 2.0, out=out), clock, runs, 5)
    return time.perf_counter() - started, statistics.median(times)


def measure(others: int, mode: str, runs: int, repeats: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Semaphore(0), context.Event()
    holders = [context.Process(target=_other, args=(ready, stop, mode)) for _ in range(others)]
    for proc in holders:
        proc.start()
    for _ in holders:
        ready.acquire()
    try:
        walls, medians = zip(*(_timed_loop(runs) for _ in range(repeats)), strict=True)
    finally:
        stop.set()
        for proc in holders:
            proc.join(30)
    return {
        "loop_ms": 1e3 * statistics.median(walls),
        "per_run_ms": 1e3 * statistics.median(walls) / (runs + 5),
        "kernel_ms": statistics.median(medians),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="0,8,16", help="comma list of N other processes")
    parser.add_argument("--modes", default=",".join(MODES), help="what the others do")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        print(f"drtriton: error: unknown mode(s) {unknown}; known: {MODES}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("drtriton: error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    print(
        f"{torch.cuda.get_device_name()}, {args.runs} timed runs per loop, "
        f"median of {args.repeats} loops in this process"
    )
    print()
    print("| other processes | they | loop ms | ms per run | kernel ms (events) |")
    print("|---:|---|---:|---:|---:|")
    for count in (int(n) for n in args.contexts.split(",")):
        for mode in modes if count else ["-"]:
            row = measure(count, mode, args.runs, args.repeats)
            print(
                f"| {count} | {mode} | {row['loop_ms']:.1f} | "
                f"{row['per_run_ms']:.3f} | {row['kernel_ms']:.4f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
