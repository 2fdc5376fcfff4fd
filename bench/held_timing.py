"""A call whose launch is slow, timed by the sandbox's clock with and without the stream hold.

    python -m bench.held_timing --delays 0,50,300,1000,3000

The call spins on the host for D microseconds (a slow Python launch, or a process
descheduled on a busy host) and then runs relu over 2^28 float32 elements. The sandbox
times it (`sandbox.timing.time_cuda`: per run flush the L2, start event, call, end event,
runs back to back) once with the stream held until each run is queued
(`sandbox.stream_hold`), and once with a 100 us GPU spin before the start event instead:
the baseline, in the same process.
Held, the reported time should not grow with D. Last, a call that synchronises inside the
timed run: the hold lets itself go after its timeout, and the run still ends.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence


def _slow_call(delay_us: float, tensor: object) -> Callable[[], None]:
    import torch

    def call() -> None:
        end = time.perf_counter() + delay_us * 1e-6
        while time.perf_counter() < end:
            pass
        torch.relu(tensor)  # type: ignore[arg-type]

    return call


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default="0,50,300,1000,3000", help="host delays, microseconds")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per row")
    parser.add_argument("--log2-elements", type=int, default=28, help="size of the relu")
    args = parser.parse_args(argv)
    try:
        delays = [float(d) for d in args.delays.split(",") if d.strip()]
    except ValueError:
        parser.error(f"--delays takes numbers of microseconds, not {args.delays!r}")
    if not delays or min(delays) < 0 or args.runs < 1 or not 10 <= args.log2_elements <= 32:
        parser.error("--delays >= 0, --runs >= 1 and --log2-elements from 10 to 32")

    import torch

    if not torch.cuda.is_available():
        print("error: this benchmark needs an NVIDIA GPU", file=sys.stderr)
        return 2
    from sandbox.timing import bind_clock, time_cuda

    held = bind_clock()
    if not held.held:
        print("error: no stream hold on this GPU (see the message above)", file=sys.stderr)
        return 1
    spin_only = dataclasses.replace(held, hold=lambda: None, release=lambda: None, held=False)
    tensor = torch.randn(1 << args.log2_elements, device="cuda")
    print(f"# Timed runs of a slow-launched relu ({torch.cuda.get_device_name(0)})\n")
    print("| host delay us | spin only: median ms | spread | held: median ms | spread |")
    print("|---:|---:|---:|---:|---:|")
    for delay in delays:
        cells = []
        for clock in (spin_only, held):
            times = time_cuda(_slow_call(delay, tensor), clock, runs=args.runs, warmup=3)
            median = statistics.median(times)
            cells += [f"{median:.4f}", f"{(max(times) - min(times)) / median:.1%}"]
        print(f"| {delay:g} | " + " | ".join(cells) + " |", flush=True)

    def synchronising() -> None:
        torch.relu(tensor)
        torch.cuda.synchronize()

    began = time.perf_counter()
    times = time_cuda(synchronising, held, runs=3, warmup=1)
    print(
        f"\nA call that synchronises inside held runs: 3 runs in {time.perf_counter() - began:.3f} s"
        f" (each hold lets go after its timeout), event ms " + ", ".join(f"{t:.3f}" for t in times)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
