"""How other processes' CUDA contexts slow one process's timed loop, on one GPU.

    python -m bench.context_contention --contexts 0,8,16,32,48

A sandbox host keeps many processes with CUDA contexts (graders, the candidate of
each job, a spare per worker). This measures the sandbox's timed loop (L2 flush,
busy-wait cover, start event, small kernel, end event, device sync: `sandbox.timing`)
in one process while N other processes hold a context each, either idle (asleep
after `torch.cuda.init()` and one allocation) or busy (launching small kernels in a
loop). The row with 0 other contexts is the baseline, measured in the same command.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from typing import Any


def _hold_context(ready: Any, stop: Any, busy: bool) -> None:
    import torch

    torch.cuda.init()
    x = torch.empty(1 << 20, device="cuda")
    torch.cuda.synchronize()
    ready.release()
    while not stop.is_set():
        if busy:
            x.mul_(1.0001)
            torch.cuda.synchronize()
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


def measure(contexts: int, busy: bool, runs: int, repeats: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Semaphore(0), context.Event()
    holders = [
        context.Process(target=_hold_context, args=(ready, stop, busy)) for _ in range(contexts)
    ]
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
    parser.add_argument("--contexts", default="0,8,16,32,48", help="comma list of N")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("drtriton: error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    print(
        f"{torch.cuda.get_device_name()}, {args.runs} timed runs per loop, median of "
        f"{args.repeats} loops in this process; other processes hold a context each"
    )
    print()
    print("| other contexts | they are | loop ms | ms per run | kernel ms (events) |")
    print("|---:|---|---:|---:|---:|")
    for count in (int(n) for n in args.contexts.split(",")):
        for busy in (False, True) if count else (False,):
            row = measure(count, busy, args.runs, args.repeats)
            print(
                f"| {count} | {'busy' if busy else 'idle'} | {row['loop_ms']:.1f} | "
                f"{row['per_run_ms']:.3f} | {row['kernel_ms']:.4f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
