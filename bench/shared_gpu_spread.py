"""A fixed kernel's measured speedup with the GPU to itself and beside a training load.

    python -m bench.shared_gpu_spread --repeats 6

On one GPU the learner and the sandbox share the card, and a timed loop with the
learner's kernels beside it measures them too: a wrong speedup, so a wrong reward. The
learner therefore holds the sandbox's GPU gate shared around its GPU phases
(`learner.rl.gpu_share`), which no timed loop (an exclusive hold) overlaps.

This benchmark verifies two fixed cases with timing on a local sandbox (one worker):
`identical` (the candidate's kernel is the problem's own, so the true speedup is 1.00) and
`relu` (Triton relu against torch.relu, the same memory traffic), in three conditions:

* `idle`: nothing else on the GPU (the baseline, same process, same sandbox);
* `gated`: a JAX process runs training-shaped phases (bf16 matmuls, ~50 ms each) back to
  back, each inside the learner's shared hold, as `drtriton train rl` does;
* `ungated`: the same load without the hold (what a learner outside the gate would do).

It prints each condition's median speedup, its range and spread ((max - min) / median),
and how many verifications the grader retimed, and writes them as JSON with `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.sandbox_throughput import identical_case, same_speed_case

# The load: training-shaped GPU phases, each inside the learner's hold when gated.
_LOAD = """
import os, sys, time
import jax, jax.numpy as jnp
from learner.rl.gpu_share import GpuShare, NoShare
share = GpuShare(sys.argv[1]) if sys.argv[1] else NoShare()
key = jax.random.PRNGKey(0)
a = jax.random.normal(key, (8192, 8192), jnp.bfloat16)
step = jax.jit(lambda x: (x @ a) * 1e-2)
x = step(a).block_until_ready()
print("load ready", flush=True)
phases = 0
while not os.path.exists(sys.argv[2]):
    with share.hold():
        for _ in range(40):
            x = step(x)
        x.block_until_ready()
    phases += 1
    time.sleep(0.002)
print(f"load phases {phases} waited {share.waited_s:.1f} s", flush=True)
"""


def _start_load(gate_dir: str, stop_file: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.2", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOAD, gate_dir, str(stop_file)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "load ready" not in line:
        proc.kill()
        raise RuntimeError(f"the JAX load did not start: {line!r}")
    return proc


def _stop_load(proc: subprocess.Popen[str], stop_file: Path) -> str:
    stop_file.touch()
    out, _ = proc.communicate(timeout=120)
    stop_file.unlink()
    return out.strip()


def _summary(speeds: list[float], retimed: int, total: int) -> dict[str, Any]:
    if not speeds:
        return {"judged": 0, "retimed": retimed, "runs": total}
    median = statistics.median(speeds)
    return {
        "median": median,
        "min": min(speeds),
        "max": max(speeds),
        "spread": (max(speeds) - min(speeds)) / median,
        "retimed": retimed,
        "runs": total,
        "speedups": speeds,
    }


def measure(repeats: int) -> dict[str, Any]:
    from sandbox.api import LocalSandbox
    from sandbox.config import SandboxConfig

    cases = {"identical": identical_case(small=False), "relu": same_speed_case(False)}
    results: dict[str, Any] = {}
    with LocalSandbox(SandboxConfig(workers=1, device="cuda")) as box:
        gate_dir = box.runner.job_root
        stop_file = Path(gate_dir).parent / f"stop-load-{os.getpid()}"
        for condition in ("idle", "gated", "ungated"):
            load = None
            if condition != "idle":
                load = _start_load(gate_dir if condition == "gated" else "", stop_file)
            started = time.perf_counter()
            try:
                for name, case in cases.items():
                    rows = [
                        box.verify(case.problem, case.candidate, timing=True)
                        for _ in range(repeats)
                    ]
                    speeds = [r.speedup_vs_eager for r in rows if r.speedup_vs_eager]
                    retimed = sum(bool(r.retimed) for r in rows)
                    verdicts = sorted({r.verdict for r in rows})
                    row = {**_summary(speeds, retimed, len(rows)), "verdicts": verdicts}
                    results.setdefault(condition, {})[name] = row
                    _print_row(condition, name, row)
            finally:
                if load is not None:
                    results.setdefault(condition, {})["load"] = _stop_load(load, stop_file)
                    print(f"  {condition}: {results[condition]['load']}")
            results[condition]["seconds"] = time.perf_counter() - started
    return results


def _print_row(condition: str, name: str, row: dict[str, Any]) -> None:
    if not row.get("median"):
        print(f"{condition:8s} {name:10s} no timed verdicts ({row})")
        return
    print(
        f"{condition:8s} {name:10s} speedup {row['median']:.3f} "
        f"({row['min']:.3f}-{row['max']:.3f}), spread {100 * row['spread']:.1f}%, "
        f"retimed {row['retimed']}/{row['runs']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=6, help="verifications per case and condition"
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (a spread needs two)")
    try:
        import torch
    except ImportError:
        print("shared_gpu_spread: needs torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("shared_gpu_spread: needs a CUDA GPU", file=sys.stderr)
        return 2
    results = measure(args.repeats)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
