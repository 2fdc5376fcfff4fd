"""Benchmark of the program generator: seconds per program per core.

Each timed unit is one slot of `synth.generate.generate_one`: wiring, skeletons, the
CP-SAT solve, printing and the profile's validation, including every rejected attempt
before the kept program. The process is single-threaded (CP-SAT one worker, torch one
thread), so its CPU time is the cost on one core; wall time is printed alongside (it
also counts waiting on a busy machine). A warm-up program first pays the one-off
imports.

    python -m bench.synth_bench                      # paper profile, levels 1 2 5 20 + curve
    python -m bench.synth_bench --count 30 --curve-count 5 --png curve.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

REFERENCE = ("public CP-SAT generator (reported, solve+render only)", 20, 0.67, 4.3)
TARGETS = {1: (None, 0.2), 2: (None, 0.2), 5: (None, 0.2), 20: (0.2, 0.5)}


def p90(xs: Sequence[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def time_level(level: int, count: int, seed: int, profile: str) -> tuple[list[float], list[float]]:
    from synth.generate import GenSpec, generate_one
    from synth.operators import OPERATOR_NAMES
    from synth.profiles import load_profile

    spec = GenSpec(level, load_profile(profile), OPERATOR_NAMES, seed)
    cpu, wall = [], []
    for index in range(count):
        c0, w0 = time.process_time(), time.perf_counter()
        generate_one(spec, index)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="paper")
    parser.add_argument("--levels", default="1,2,5,20")
    parser.add_argument("--count", type=int, default=100, help="programs per level")
    parser.add_argument("--curve", default="1-30", help="levels of the cost curve, as A-B")
    parser.add_argument("--curve-count", type=int, default=20, help="programs per curve level")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--png", default=None, help="also plot the cost curve here")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    time_level(3, 1, args.seed + 1, args.profile)  # warm-up: imports, first meta/solver calls

    print(f"## synth generator, profile `{args.profile}`, seconds per program per core\n")
    print(
        "| level | programs | CPU median | CPU p90 | wall median | wall p90 | target (median / p90) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    for level in (int(x) for x in args.levels.split(",")):
        cpu, wall = time_level(level, args.count, args.seed, args.profile)
        med, hi = TARGETS.get(level, (None, None))
        target = f"{'-' if med is None else f'<= {med}'} / {'-' if hi is None else f'<= {hi}'}"
        print(
            f"| {level} | {len(cpu)} | {statistics.median(cpu):.3f} | {p90(cpu):.3f} "
            f"| {statistics.median(wall):.3f} | {p90(wall):.3f} | {target} |"
        )
        sys.stdout.flush()
    name, level, med, hi = REFERENCE
    print(f"| {level} ({name}) | - | {med} | {hi} | - | - | reference |")

    lo, hi_level = (int(x) for x in args.curve.split("-"))
    print(f"\n## cost curve ({args.curve_count} programs per level)\n")
    print("| level | CPU median | CPU p90 | wall median |")
    print("|---:|---:|---:|---:|")
    curve = []
    for level in range(lo, hi_level + 1):
        cpu, wall = time_level(level, args.curve_count, args.seed + 7, args.profile)
        curve.append((level, statistics.median(cpu), p90(cpu)))
        print(
            f"| {level} | {curve[-1][1]:.3f} | {curve[-1][2]:.3f} | {statistics.median(wall):.3f} |"
        )
        sys.stdout.flush()
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([c[0] for c in curve], [c[1] for c in curve], "o-", label="median")
        ax.plot([c[0] for c in curve], [c[2] for c in curve], "s--", label="p90")
        ax.set_xlabel("level (operators per program)")
        ax.set_ylabel("CPU seconds per program")
        ax.set_title(f"synth generate, profile {args.profile}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
