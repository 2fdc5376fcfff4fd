"""The candidate guard's host cost per call, and what the grader's timing makes of it.

    python -m bench.guard_overhead --out runs/guard_overhead.json   # a GPU host

Two parts, each against its baseline in the same command:
1. In this process: a Triton relu launched back to back by the host clock, plain and then
   inside the guard's timed stretch (the instruments a candidate process runs under), at a
   host-bound size (64 x 64) and a GPU-bound one (8192 x 8192). The difference is the
   guard's cost per call; where it exceeds the kernel's GPU time, the grader's host-clock
   check counts it against the candidate.
2. Through a local sandbox (`--sandbox`, run in a separate command because part 1 installs
   the instruments in this process): the identical-kernel problem and a Triton relu against
   torch.relu verified N times each, with the reported candidate time, the eager baseline
   and whether the host clock's figure counted (speedups should read 1.00).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.sandbox_throughput import identical_case, same_speed_case

SIZES = {"host_bound": (64, 64), "gpu_bound": (8192, 8192)}


def _relu_entry(shape: tuple[int, int]) -> tuple[Any, list[Any]]:
    """The benchmark's Triton relu, imported from a file (Triton reads kernels' source)."""
    import importlib.util
    import tempfile

    import torch

    path = Path(tempfile.mkdtemp()) / "relu_candidate.py"
    path.write_text(identical_case(small=False).candidate)
    spec = importlib.util.spec_from_file_location("relu_candidate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.triton_fused_operator, [torch.randn(shape, device="cuda")]


def _per_call_us(fn: Any, clock: Any, runs: int, repeats: int) -> list[float]:
    from sandbox.timing import time_wall

    return [time_wall(fn, clock, runs) * 1e3 for _ in range(repeats)]


def measure_in_process(runs: int, repeats: int) -> dict[str, Any]:
    """Plain and guarded host time per call, and the events' GPU time, per size."""
    from sandbox import guard
    from sandbox.timing import bind_clock, summarize, time_cuda

    clock = bind_clock()
    entries = {name: _relu_entry(shape) for name, shape in SIZES.items()}
    out: dict[str, Any] = {}
    for name, (entry, inputs) in entries.items():
        call = lambda entry=entry, inputs=inputs: entry(*inputs)  # noqa: E731
        gpu_us = summarize(time_cuda(call, clock, runs, 5))[0] * 1e3
        out[name] = {"gpu_us": gpu_us, "plain_us": _per_call_us(call, clock, runs, repeats)}
    instruments = guard.install("cuda")
    for name, (entry, inputs) in entries.items():
        loop = instruments.call("normal", lambda error: "runtime_error", steps=True)
        with loop:
            guarded = loop.armed(lambda entry=entry, inputs=inputs: entry(*inputs))
            out[name]["guarded_us"] = _per_call_us(guarded, clock, runs, repeats)
        out[name]["report"] = str(loop.report)
    return out


def measure_sandbox(repeats: int) -> dict[str, Any]:
    """The identical kernel verified `repeats` times by a local sandbox."""
    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig

    cases = {"identical": identical_case(small=False), "relu_vs_torch": same_speed_case(False)}
    out: dict[str, Any] = {}
    with LocalSandbox(SandboxConfig(workers=1, device="cuda")) as box:
        for name, case in cases.items():
            rows = []
            for _ in range(repeats):
                r = box.verify(case.problem, case.candidate, timing=True)
                rows.append(
                    {
                        "verdict": r.verdict,
                        "candidate_ms": r.candidate_ms,
                        "eager_ms": r.eager_ms,
                        "speedup": r.speedup_vs_eager,
                        "retimed": r.retimed,
                        "spread": r.candidate_spread,
                    }
                )
            speeds = [row["speedup"] for row in rows if row["speedup"]]
            if speeds:
                print(
                    f"{name}: speedup median {statistics.median(speeds):.3f} "
                    f"({min(speeds):.3f}-{max(speeds):.3f}), retimed "
                    f"{sum(bool(row['retimed']) for row in rows)}/{len(rows)}"
                )
            out[name] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.guard_overhead")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sandbox", action="store_true", help="part 2 (a separate command)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench.guard_overhead needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.monotonic()
    result = (
        measure_sandbox(args.repeats)
        if args.sandbox
        else measure_in_process(args.runs, args.repeats)
    )
    result["seconds"] = time.monotonic() - started
    for name, row in result.items():
        if isinstance(row, dict) and "plain_us" in row:
            plain, held = statistics.median(row["plain_us"]), statistics.median(row["guarded_us"])
            print(
                f"{name}: GPU {row['gpu_us']:.1f} us, host plain {plain:.1f} us, "
                f"guarded {held:.1f} us (+{held - plain:.1f})"
            )
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
