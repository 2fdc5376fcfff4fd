"""How many whole CUDA processes (start, a little work, exit) one host gets through a second.

    python -m bench.cuda_lifecycles --in-flight 8 --seconds 8 \
        --steps context,context+fill+sleep+hold+h2d,context+allocs,context+triton
    python -m bench.cuda_lifecycles --in-flight 8,16 --steps context,context+triton

A sandbox that gives every candidate its own process pays, per candidate, for a CUDA
context made and torn down by the driver, plus whatever else the process asks of the
driver (kernels it loads, pinned memory, copies). `bench.cuda_startup` times the start of N
processes launched together; this keeps `--in-flight` forks of a parent with torch and
Triton imported (as the zygote's are) running at all times, a new one as each exits, and
counts the exits: the steady-state rate that bounds verifications per second. Each step set
is run forwards and then backwards through the list (drift between the halves shows as
their spread); the first set, `context` alone by default, is the baseline of the same
command.

Steps (joined with `+`): `context` (CUDA's context and a 4 MiB allocation, always done);
`reserve` (one 512 MiB block taken from the driver and given back to PyTorch's cache at
once, so that the later steps' large tensors are cut from it instead of each asking the
driver);
`fill` (PyTorch's fill kernel, as the timing clock's flush and the no-op check use);
`sleep` (PyTorch's spin kernel); `ops` (three more PyTorch kernels: sigmoid, softmax, mul);
`h2d` / `d2h` (a 4 MiB pageable copy); `flush` (the clock's 256 MiB flush buffer, zeroed);
`hold` (the stream hold's kernel and pinned word, `sandbox.stream_hold`); `allocs` (five
more tensors of new sizes, 256 KiB to 12 MiB: each a fresh block from the driver, as a
candidate's inputs and outputs are); `triton` (a small Triton kernel compiled into the
process's own cache, loaded and launched, as each candidate's is; the parent has warmed the
compiler, as the zygote does); `ns` (the fork first enters new pid, mount and network
namespaces, as candidates do). `--env` adds settings of CUDA's environment to compare
(NAME=VALUE, `;` between settings). Several `--in-flight` counts tell serial work from
latency: a step set whose rate rises with the count was bounded by how long its steps take,
not by the driver's serial time (a Triton compile, CPU work on idle cores, is the former).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from sandbox.isolation import enter_namespaces, mount_proc
from sandbox.stream_hold import stream_hold

STEPS = (
    "context", "reserve", "fill", "sleep", "ops", "h2d", "d2h", "flush", "hold", "allocs",
    "triton", "ns",
)  # fmt: skip
_RESERVE_BYTES = 512 << 20  # the `reserve` step's one segment: room for the flush and allocs
_ALLOC_BYTES = (256 << 10, 1 << 20, 3 << 20, 6 << 20, 12 << 20)  # the `allocs` step's tensors


@triton.jit
def _scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


def _triton_kernel(block: torch.Tensor) -> None:
    """Compile `_scale` into a cache of this process's own, load it and launch it.

    Triton's driver helpers come from the shared cache first, as a candidate's come from
    the sandbox's seed of them: only the kernel is compiled here.
    """
    from triton.runtime import driver

    driver.active.utils  # noqa: B018 - loads (or, in the first process, builds) the helpers
    cache = tempfile.mkdtemp(prefix="lifecycle-triton-")
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        n = block.numel()
        _scale[(triton.cdiv(n, 1024),)](block, block, n, BLOCK=1024)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _run_steps(steps: set[str]) -> None:
    """One candidate-like process's CUDA work; the caller exits right after."""
    if "ns" in steps:
        enter_namespaces()
        inner = os.fork()
        if inner:
            _, status = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        mount_proc()
    block = torch.empty(1 << 20, device="cuda")  # the context, made by the first allocation
    actions: dict[str, Callable[[], object]] = {
        "reserve": lambda: torch.empty(_RESERVE_BYTES, dtype=torch.uint8, device="cuda"),
        "fill": block.zero_,
        "sleep": lambda: torch.cuda._sleep(100),
        "ops": lambda: (torch.sigmoid(block), torch.softmax(block.view(1024, -1), 1), block * 2),
        "h2d": lambda: block.copy_(torch.ones(1 << 20)),
        "d2h": lambda: torch.empty(1 << 20).copy_(block),
        "flush": lambda: torch.empty(64 << 20, dtype=torch.int32, device="cuda").zero_(),
        "hold": stream_hold,
        "allocs": lambda: [torch.empty(n // 4, device="cuda") for n in _ALLOC_BYTES],
        "triton": lambda: _triton_kernel(block),
    }
    for step in STEPS:
        if step in actions and step in steps:
            actions[step]()
    torch.cuda.synchronize()


def lifecycles(steps: set[str], env: dict[str, str], in_flight: int, seconds: float) -> float:
    """Processes that started CUDA, did `steps` and exited, per second, `in_flight` at a time."""
    began = time.monotonic()
    live: set[int] = set()
    done = failed = 0
    while True:
        while len(live) < in_flight and time.monotonic() - began < seconds:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.environ.update(env)
                    _run_steps(steps)
                    code = 0
                finally:
                    os._exit(code)
            live.add(pid)
        if not live:
            break
        pid, status = os.wait()
        live.discard(pid)
        done += 1
        failed += os.waitstatus_to_exitcode(status) != 0
    if failed:
        raise RuntimeError(f"{failed} of {done} processes failed")
    return done / (time.monotonic() - began)


def parse_env(text: str) -> list[dict[str, str]]:
    """`A=1;B=2,C=3` -> settings [{A: 1}, {B: 2, C: 3}]; an empty part is no extra setting."""
    settings = []
    for part in text.split(";"):
        pairs = [p.strip() for p in part.split(",") if p.strip()]
        if any("=" not in p or not p.split("=", 1)[0] for p in pairs):
            raise ValueError(f"expected NAME=VALUE settings, not {part!r}")
        settings.append(dict(p.split("=", 1) for p in pairs))
    return settings


Row = tuple[str, str, list[float]]


def render(rows: list[Row], in_flight: int | list[int], gpu: str) -> str:
    """Markdown: per step set and setting, the median rate and its ratio to the first row.

    With several `in_flight` counts a row's steps carry ` xN` (N alive at once), and `ms a
    process` is the time one process takes of the whole at that rate: where it stays level
    as N grows, that is serial work (the driver's); where the rate grows with N, the steps'
    latency was bounding it instead.
    """
    counts = in_flight if isinstance(in_flight, list) else [in_flight]
    base = statistics.median(rows[0][2]) if rows else 0.0
    alive = ", ".join(str(n) for n in counts)
    lines = [
        f"# CUDA process lifecycles ({gpu}, {alive} in flight)",
        "",
        "| steps | environment | processes/s | ms a process | runs | spread | vs first row |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for steps, env, rates in rows:
        rate = statistics.median(rates)
        spread = (max(rates) - min(rates)) / rate if rate else 0.0
        lines.append(
            f"| {steps} | {env or '-'} | {rate:.2f} | {1e3 / rate if rate else 0:.1f} "
            f"| {len(rates)} | {100 * spread:.1f}% | {rate / base:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--in-flight", default="8", help="processes alive at once (a comma list compares counts)"
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="per step set and half")
    parser.add_argument(
        "--steps",
        default="context,context+fill+sleep+flush+hold+h2d+d2h,context+allocs,context+triton",
        help="comma list of step sets",
    )
    parser.add_argument("--env", default="", help="';'-separated CUDA settings to compare")
    parser.add_argument(
        "--arch",
        type=int,
        default=90,
        help="compute capability the parent's compiler is warmed for",
    )
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    sets = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = {step for s in sets for step in s.split("+")} - set(STEPS)
    if not sets or unknown:
        parser.error(f"--steps takes sets of {', '.join(STEPS)} joined by '+'; not {unknown}")
    try:
        counts = [int(n) for n in args.in_flight.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.seconds <= 0:
        parser.error("--in-flight needs counts >= 1 (like 8,16) and --seconds > 0")
    try:
        settings = parse_env(args.env)
    except ValueError as err:
        parser.error(str(err))
    # Every candidate gets one hardware queue (`sandbox.process.candidate_env`).
    base_env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}

    try:
        lifecycles({"context"}, base_env, 1, 0.01)  # a warm-up, and whether CUDA starts at all
    except RuntimeError:
        print("error: this benchmark needs an NVIDIA GPU (CUDA did not start)", file=sys.stderr)
        return 2
    if any("triton" in s.split("+") for s in sets):
        from sandbox.zygote import warm_compile

        warm_compile(args.arch)
    plan = [(s, e, n) for s in sets for e in settings for n in counts]
    rates: dict[tuple[str, str], list[float]] = {}
    for steps, env, alive in [*plan, *reversed(plan)]:
        label = ",".join(f"{k}={v}" for k, v in env.items())
        rate = lifecycles(set(steps.split("+")), {**base_env, **env}, alive, args.seconds)
        name = steps if len(counts) == 1 else f"{steps} x{alive}"
        rates.setdefault((name, label), []).append(rate)
        print(f"{name} {label or '-'}: {rate:.2f}/s", flush=True)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "GPU"
    table = render([(s, e, r) for (s, e), r in rates.items()], counts, gpu)
    print(table)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
