"""A candidate's first Triton compile, forked from a cold or a warmed zygote.

    python -m bench.zygote_compile --repeats 5

Each repeat starts a fresh process that imports torch and Triton (a zygote), warms
Triton's compiler or not (`sandbox.zygote.warm_compile`), then forks a child that
compiles a kernel it has never seen for sm_90 and reports the seconds. No GPU is
needed: the compile goes as far as the cubin (ptxas). The baseline (cold) runs in
the same command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parent.parent)

_CHILD = r"""
import json, os, sys, time
import torch, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sandbox.zygote import warm_compile


@triton.jit
def fresh(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x * y, 0.0) + tl.cos(x), mask=mask)


if sys.argv[1] == "warm":
    warm_compile(90)
read, write = os.pipe()
if os.fork() == 0:
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                 "BLOCK": "constexpr"}
    started = time.perf_counter()
    triton.compile(ASTSource(fresh, signature, {"BLOCK": 512}), target=GPUTarget("cuda", 90, 32))
    os.write(write, json.dumps(time.perf_counter() - started).encode())
    os._exit(0)
os.close(write)
print(os.read(read, 100).decode())
"""


def first_compile_s(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OPENBLAS_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as scratch:
        env["TRITON_CACHE_DIR"] = os.path.join(scratch, "cache")
        script = os.path.join(scratch, "zygote.py")  # @triton.jit reads its source from a file
        with open(script, "w") as handle:
            handle.write(_CHILD)
        done = subprocess.run(
            [sys.executable, script, mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = {mode: [first_compile_s(mode) for _ in range(args.repeats)] for mode in ("cold", "warm")}
    print("| zygote | first compile in the fork, s (median) | min | max |")
    print("|---|---:|---:|---:|")
    for mode, times in rows.items():
        print(f"| {mode} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |")
    ratio = statistics.median(rows["cold"]) / statistics.median(rows["warm"])
    print(f"\nwarm is {ratio:.1f}x faster ({args.repeats} repeats each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
