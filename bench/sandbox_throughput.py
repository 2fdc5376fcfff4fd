"""Sandbox throughput and timing fidelity, next to a plain KernelBench-style harness.

    python -m bench.sandbox_throughput --out runs/sandbox_throughput.md          # a GPU host
    python -m bench.sandbox_throughput --quick --allow-weak-isolation --out x.md  # CPU smoke run

What it measures, in one run:
1. Verifications per second through a real `drtriton sandbox serve` (5 trials, timing
   against eager and torch.compile, the full isolation pipeline) over >= 200 small
   single-operator candidates, for each worker count.
2. The same candidates through a plain harness: one fresh process per candidate that
   imports torch and Triton, runs reference and candidate 5 times, compares, and times
   both with CUDA events; as many processes at once as the server had workers. The
   ratio of the two is the price of isolation and of the extra checks.
3. The machine's own ceiling, before the first server: bare CUDA processes (a context made
   and torn down, 8 alive at once; `bench.cuda_lifecycles --steps context`) a second. Every
   candidate needs one such process, the rate moves by a third between machines of one
   kind, and each row's rate is also given as a share of it.
4. Timing fidelity: one kernel verified 10 times (spread of the reported medians), and
   a candidate doing exactly the eager operation's memory traffic (a Triton relu
   against torch.relu), whose speedup should read ~1.00; that check again while the other
   workers verify GiB elementwise kernels (the load of a teacher or RL run).

Candidates are generated from a few templates (elementwise unary and binary, row
reductions, softmax) over varied shapes; every one of them is correct, so a verdict
other than `correct` is a finding.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from sandbox.result import VerifyResult

REPO_ROOT = Path(__file__).resolve().parent.parent

# -- candidates ------------------------------------------------------------------------------

_HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"

# name: (PyTorch expression of tensor_0 [and tensor_1], Triton expression of x [and y])
UNARY = {
    "relu": ("torch.relu(tensor_0)", "tl.maximum(x, 0.0)"),
    "sigmoid": ("torch.sigmoid(tensor_0)", "tl.sigmoid(x)"),
    "abs": ("torch.abs(tensor_0)", "tl.abs(x)"),
    "silu": ("F.silu(tensor_0)", "x * tl.sigmoid(x)"),
    "softsign": ("F.softsign(tensor_0)", "x / (1.0 + tl.abs(x))"),
    "leaky_relu": ("F.leaky_relu(tensor_0, 0.01)", "tl.where(x > 0, x, 0.01 * x)"),
    "tanh": ("torch.tanh(tensor_0)", "2.0 * tl.sigmoid(2.0 * x) - 1.0"),
}
BINARY = {
    "add": ("torch.add(tensor_0, tensor_1)", "x + y"),
    "sub": ("torch.sub(tensor_0, tensor_1)", "x - y"),
    "mul": ("torch.mul(tensor_0, tensor_1)", "x * y"),
    "maximum": ("torch.maximum(tensor_0, tensor_1)", "tl.maximum(x, y)"),
}
# name: (PyTorch expression, masked-load fill, Triton reduction of x over the row)
ROW_REDUCE = {
    "sum": ("torch.sum(tensor_0, dim=1)", "0.0", "tl.sum(x, axis=0)"),
    "mean": ("torch.mean(tensor_0, dim=1)", "0.0", "tl.sum(x, axis=0) / C"),
    "max": ("torch.max(tensor_0, dim=1).values", "-float('inf')", "tl.max(x, axis=0)"),
}


@dataclass(frozen=True)
class Case:
    name: str
    problem: str
    candidate: str


def _problem(shape: tuple[int, int], arity: int, expression: str) -> str:
    inputs = "".join(
        f"    tensor_{i} = torch.randn({list(shape)}, dtype=torch.float32)\n" for i in range(arity)
    )
    args = ", ".join(f"tensor_{i}" for i in range(arity))
    return (
        "import torch\nimport torch.nn.functional as F\n\n\n"
        f"def get_inputs():\n{inputs}    return [{args}]\n\n\n"
        f"def fused_operator({args}):\n"
        f"    tensor_{arity} = {expression}\n"
        f"    return [tensor_{arity}]\n"
    )


def elementwise_case(name: str, shape: tuple[int, int], block: int) -> Case:
    binary = name in BINARY
    torch_expr, triton_expr = (BINARY if binary else UNARY)[name]
    y_param = "y_ptr, " if binary else ""
    y_load = "    y = tl.load(y_ptr + offs, mask=mask, other=0.0)\n" if binary else ""
    args = "tensor_0, tensor_1" if binary else "tensor_0"
    candidate = (
        _HEADER + "@triton.jit\n"
        f"def _kernel(x_ptr, {y_param}out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    mask = offs < n\n"
        "    x = tl.load(x_ptr + offs, mask=mask, other=0.0)\n"
        f"{y_load}"
        f"    tl.store(out_ptr + offs, {triton_expr}, mask=mask)\n\n\n"
        f"def triton_fused_operator({args}):\n"
        "    out = torch.empty_like(tensor_0)\n"
        "    n = tensor_0.numel()\n"
        f"    _kernel[(triton.cdiv(n, {block}),)]({args}, out, n, BLOCK={block})\n"
        "    return [out]\n"
    )
    return Case(
        f"{name}_{shape[0]}x{shape[1]}",
        _problem(shape, 2 if binary else 1, torch_expr),
        candidate,
    )


def reduce_case(name: str, shape: tuple[int, int]) -> Case:
    torch_expr, fill, reduction = ROW_REDUCE[name]
    candidate = (
        _HEADER + "@triton.jit\n"
        "def _kernel(x_ptr, out_ptr, C, BLOCK: tl.constexpr):\n"
        "    row = tl.program_id(0)\n"
        "    cols = tl.arange(0, BLOCK)\n"
        "    mask = cols < C\n"
        f"    x = tl.load(x_ptr + row * C + cols, mask=mask, other={fill})\n"
        f"    tl.store(out_ptr + row, {reduction})\n\n\n"
        "def triton_fused_operator(tensor_0):\n"
        "    R, C = tensor_0.shape\n"
        "    out = torch.empty((R,), device=tensor_0.device, dtype=tensor_0.dtype)\n"
        "    _kernel[(R,)](tensor_0, out, C, BLOCK=triton.next_power_of_2(C))\n"
        "    return [out]\n"
    )
    return Case(f"row_{name}_{shape[0]}x{shape[1]}", _problem(shape, 1, torch_expr), candidate)


def softmax_case(shape: tuple[int, int]) -> Case:
    candidate = (
        _HEADER + "@triton.jit\n"
        "def _kernel(x_ptr, out_ptr, C, BLOCK: tl.constexpr):\n"
        "    row = tl.program_id(0)\n"
        "    cols = tl.arange(0, BLOCK)\n"
        "    mask = cols < C\n"
        "    x = tl.load(x_ptr + row * C + cols, mask=mask, other=-float('inf'))\n"
        "    e = tl.exp(x - tl.max(x, axis=0))\n"
        "    e = tl.where(mask, e, 0.0)\n"
        "    tl.store(out_ptr + row * C + cols, e / tl.sum(e, axis=0), mask=mask)\n\n\n"
        "def triton_fused_operator(tensor_0):\n"
        "    R, C = tensor_0.shape\n"
        "    out = torch.empty_like(tensor_0)\n"
        "    _kernel[(R,)](tensor_0, out, C, BLOCK=triton.next_power_of_2(C))\n"
        "    return [out]\n"
    )
    return Case(
        f"softmax_{shape[0]}x{shape[1]}",
        _problem(shape, 1, "torch.softmax(tensor_0, dim=1)"),
        candidate,
    )


def generate_cases(count: int, small: bool, seed: int = 0, per_problem: int = 1) -> list[Case]:
    """`count` correct single-operator candidates over varied shapes.

    With `per_problem` > 1, problems come in groups of that many candidates (an RL step
    samples a group per prompt), so the sandbox's per-problem baselines are reused.
    """
    rng = random.Random(seed)
    kinds = [*UNARY, *BINARY, *(f"row_{n}" for n in ROW_REDUCE), "softmax"]
    # Small single-operator problems: at most 4 Mi elements (16 MiB) per tensor on a GPU.
    rows = (4, 64) if small else (64, 2048)
    cols = (8, 64) if small else (64, 2048)
    cases = []
    shape = (0, 0)
    for i in range(count):
        kind = kinds[(i // per_problem) % len(kinds)]
        if i % per_problem == 0:
            shape = (rng.randint(*rows), rng.randint(*cols))
        if kind.startswith("row_"):
            case = reduce_case(kind[4:], shape)
        elif kind == "softmax":
            case = softmax_case(shape)
        else:
            case = elementwise_case(kind, shape, rng.choice((256, 512, 1024)))
        cases.append(Case(f"{case.name}_{i}", case.problem, case.candidate))
    return cases


def same_speed_case(small: bool) -> Case:
    """Exactly eager relu's memory traffic, in Triton: its speedup should read ~1.00."""
    shape = (64, 64) if small else (8192, 8192)
    case = elementwise_case("relu", shape, 1024)
    return Case("same_speed_relu", case.problem, case.candidate)


def identical_case(small: bool) -> Case:
    """The same Triton kernel as the problem's own code and as the candidate.

    The eager baseline then runs exactly the candidate's kernel, in the grader's
    process: any speedup other than 1.00 is the timing's error, not the kernel's.
    """
    relu = same_speed_case(small)
    kernel, entry = relu.candidate.split("def triton_fused_operator")
    problem = (
        kernel
        + "def get_inputs():\n"
        + f"    return [torch.randn({[64, 64] if small else [8192, 8192]}, dtype=torch.float32)]\n\n\n"
        + "def fused_operator"
        + entry
    )
    return Case("identical_relu", problem, relu.candidate)


# -- the plain harness -----------------------------------------------------------------------


def harness_main(argv: list[str]) -> int:
    """One candidate in one process, reference and candidate together (KernelBench-style)."""
    parser = argparse.ArgumentParser(prog="sandbox_throughput _harness")
    parser.add_argument("problem")
    parser.add_argument("candidate")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import importlib.util

    import torch

    def load(path: str, name: str) -> Any:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    started = time.perf_counter()
    problem = load(args.problem, "problem")
    candidate = load(args.candidate, "candidate")
    correct = True
    inputs: list[Any] = []
    for trial in range(args.trials):
        torch.manual_seed(trial)
        inputs = [t.to(args.device) for t in problem.get_inputs()]
        expected = problem.fused_operator(*inputs)
        got = candidate.triton_fused_operator(*[t.clone() for t in inputs])
        correct = correct and len(got) == len(expected)
        correct = correct and all(
            g.shape == e.shape and torch.allclose(g, e, atol=1e-4, rtol=1e-4)
            for g, e in zip(got, expected, strict=False)
        )
    result: dict[str, Any] = {"correct": bool(correct)}
    if args.device == "cuda":

        def median_ms(fn: Any) -> float:
            for _ in range(args.warmup):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(args.runs):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            return statistics.median(times)

        result["candidate_ms"] = median_ms(lambda: candidate.triton_fused_operator(*inputs))
        result["eager_ms"] = median_ms(lambda: problem.fused_operator(*inputs))
    result["elapsed_s"] = time.perf_counter() - started
    print(json.dumps(result))
    return 0


def run_plain(
    cases: list[Case], files: dict[str, tuple[Path, Path]], parallel: int, device: str
) -> tuple[float, Counter[str], list[dict[str, Any]]]:
    """(seconds, outcome counts, per-case results) with `parallel` harness processes at once."""

    def one(case: Case) -> dict[str, Any]:
        problem, candidate = files[case.name]
        done = subprocess.run(
            [sys.executable, "-m", "bench.sandbox_throughput", "_harness",
             str(problem), str(candidate), "--device", device],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            return {"correct": False, "error": done.stderr.strip().splitlines()[-1:]}
        return json.loads(done.stdout.strip().splitlines()[-1])

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        results = list(pool.map(one, cases))
    elapsed = time.monotonic() - started
    counts = Counter(
        "correct" if r.get("correct") else ("error" if "error" in r else "wrong") for r in results
    )
    return elapsed, counts, results


# -- a real server -----------------------------------------------------------------------------


class Server:
    """`drtriton sandbox serve` in a subprocess (port from its first stdout line)."""

    def __init__(
        self,
        workers: int,
        device: str,
        queue_capacity: int,
        weak: bool,
        log: Path | None = None,
        spares: int = 1,
    ) -> None:
        args = [
            sys.executable, "-m", "drtriton_cli", "sandbox", "serve", "--port", "0",
            "--device", device, "--workers", str(workers), "--queue", str(queue_capacity),
            "--spares", str(spares),
        ]  # fmt: skip
        if weak:
            args.append("--allow-weak-isolation")
        self.proc = subprocess.Popen(
            args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        log_file = open(log, "a") if log else None  # noqa: SIM115 - lives as long as the server

        def keep(line: str) -> None:
            self.stderr.append(line)
            if log_file is not None:
                log_file.write(line)
                log_file.flush()

        # A server that exits before its first line ends stdout: "" wakes the wait at once.
        out = threading.Thread(target=self._pump, args=(self.proc.stdout, lines.put, ""))
        err = threading.Thread(target=self._pump, args=(self.proc.stderr, keep))
        for pump in (out, err):
            pump.daemon = True
            pump.start()
        try:
            first = lines.get(timeout=900)
        except queue.Empty:
            first = ""
        if not first.startswith("listening on "):
            self.proc.kill()
            err.join(timeout=10)  # what it said before it died
            raise RuntimeError(f"the server did not start: {''.join(self.stderr).strip()}")
        self.target = first.split()[-1]

    @staticmethod
    def _pump(stream: Any, sink: Any, at_end: str | None = None) -> None:
        for line in stream:
            sink(line)
        if at_end is not None:
            sink(at_end)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


def verify_logged(client: Any, items: list[dict[str, Any]], concurrency: int) -> list[Any]:
    """`verify_many`, with a plain progress line every tenth of the way (logs, not a TTY)."""
    from concurrent.futures import as_completed

    results: list[Any] = [None] * len(items)
    started = time.monotonic()
    step = max(1, len(items) // 10)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = {
            pool.submit(client.verify_many, [item], concurrency=1): i
            for i, item in enumerate(items)
        }
        for done, future in enumerate(as_completed(futures), 1):
            results[futures[future]] = future.result()[0]
            if done % step == 0 or done == len(items):
                elapsed = time.monotonic() - started
                print(
                    f"  {done}/{len(items)} verified, {elapsed:.0f} s, {done / elapsed:.2f}/s",
                    flush=True,
                )
    return results


def while_loaded(client: Any, load: list[dict[str, Any]], concurrency: int, measure: Any) -> int:
    """Run `measure()` while `concurrency` threads keep the server verifying `load` (round
    robin, one job each at a time); how many load jobs ran meanwhile."""
    stop = threading.Event()
    count = [0]
    lock = threading.Lock()

    def keep_busy(first: int) -> None:
        index = first
        while not stop.is_set():
            client.verify_many([load[index % len(load)]], concurrency=1)
            index += concurrency
            with lock:
                count[0] += 1

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        busy = [pool.submit(keep_busy, k) for k in range(concurrency)]
        try:
            measure()
        finally:
            stop.set()
            for future in busy:
                future.result()
    return count[0]


def load_cases(small: bool) -> list[Case]:
    """GiB elementwise problems (unary and binary): each job moves GiBs through the GPU and
    starts and ends a candidate process holding them, as paper-sized programs do."""
    shape = (256, 256) if small else (16384, 16384)
    return [elementwise_case(name, shape, 1024) for name in ("relu", "add", "sigmoid", "mul")]


@dataclass
class Row:
    workers: int
    per_problem: int
    count: int
    spares: int = 1
    in_flight: int = 2  # requests the client keeps in flight, per worker
    timed: bool = True  # the requests asked for timing (off: what timing costs a verification)
    sandbox_s: float = 0.0
    plain_s: float = 0.0
    sandbox_verdicts: Counter[str] = field(default_factory=Counter)
    plain_outcomes: Counter[str] = field(default_factory=Counter)
    stages: dict[str, list[float]] = field(default_factory=dict)
    startup_s: float = 0.0
    plain_count: int = 0
    cpu_busy: float | None = None  # fraction of the host's CPU busy during the sandbox run
    job_s: float = 0.0  # the jobs' own seconds (each `elapsed_s`), summed

    @property
    def workers_busy(self) -> float | None:
        return busy_share(self.job_s, self.workers, self.sandbox_s)

    @property
    def sandbox_rate(self) -> float:
        return self.count / self.sandbox_s if self.sandbox_s else 0.0

    @property
    def plain_rate(self) -> float:
        return self.plain_count / self.plain_s if self.plain_s else 0.0


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    median = statistics.median(values)
    return (
        f"median {median:.4g}, min {min(values):.4g}, max {max(values):.4g}, "
        f"(max-min)/median {(max(values) - min(values)) / median:.1%}, "
        f"cv {statistics.stdev(values) / statistics.mean(values):.1%}"
    )


STAGE_ORDER = (
    "queue", "static", "problem", "gpu_memory_wait", "spawn", "start", "load", "compile",
    "gpu_wait", "reference", "first_trial", "trials", "noop_check", "baseline_compile",
    "timing_io", "timing_wait", "timing_overrun_wait", "timing", "timed_loops", "cleanup", "release",
    "other",
)  # fmt: skip
# Stages inside another (`timing` holds the candidate's `timed_loops`) or outside the
# grader's job (`queue`): left out of the sum that `other` completes to the job's time.
NOT_IN_JOB_SUM = frozenset({"queue", "timed_loops"})


def busy_share(job_seconds: float, workers: int, wall_s: float) -> float | None:
    """The share of the workers' time spent inside jobs: the rest is hand-over between jobs
    (results back, the next job in) and the run's start and end, where some workers wait."""
    if wall_s <= 0 or workers < 1:
        return None
    return job_seconds / (workers * wall_s)


def other_seconds(stages: dict[str, float], elapsed_s: float) -> float:
    """The job's time that no stage accounts for (bookkeeping, files, the reaper's start).

    Dotted stages (`run.exchange`, `rounding.float64`) are parts of another stage's time.
    """
    counted = (v for k, v in stages.items() if k not in NOT_IN_JOB_SUM and "." not in k)
    return max(0.0, elapsed_s - sum(counted))


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host so far, from /proc/stat (0, 0 elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def stage_table(rows: list[Row]) -> list[str]:
    """Median, mean and max seconds per stage and row: where a verification's wall time goes
    (the means of the undotted stages add up to a worker's time per job; medians do not)."""
    names = [n for n in STAGE_ORDER if any(n in r.stages for r in rows)]
    names += sorted({n for r in rows for n in r.stages} - set(names))
    lines = [
        "| workers x per-problem x spares x in flight | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for row in rows:
        cells = []
        for name in names:
            values = row.stages.get(name, [])
            # Stages a job skipped (a cached baseline) count as 0 s.
            values = values + [0.0] * (row.count - len(values)) if values else []
            cells.append(
                f"{statistics.median(values):.3f} / {statistics.fmean(values):.3f} / "
                f"{max(values):.2f}"
                if values
                else "-"
            )
        label = f"{row.workers} x {row.per_problem} x {row.spares} x {row.workers * row.in_flight}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def render(
    rows: list[Row],
    device: str,
    timing: bool,
    fidelity_lines: list[str],
    notes: list[str],
    process_rate: float | None = None,
) -> str:
    """The report; `process_rate`: the machine's bare CUDA processes a second, if measured."""
    md = [
        "# Sandbox throughput",
        "",
        f"Generated single-operator candidates (all correct), device `{device}`, "
        f"5 trials{', timing vs eager and torch.compile' if timing else ', no timing (CPU)'}. "
        "`per problem`: candidates per distinct problem (an RL group shares a problem, and the "
        "sandbox caches its baselines); 1 = every candidate a new problem.",
        "Plain harness: one process per candidate, reference and candidate in it, "
        "5 trials" + (", CUDA-event timing of candidate and eager" if timing else "") + ".",
        "",
        "`in flight`: requests the client keeps open at once. `workers busy`: the share of "
        "the workers' time inside jobs (the stage table's job time); the rest is hand-over "
        "between jobs and the run's start and end.",
        "",
        *(
            [
                f"This machine makes and tears down {process_rate:.2f} bare CUDA processes a "
                "second (context only, 8 alive at once, before the first server): every "
                "candidate needs one, so `of bare` is each row's share of that ceiling.",
                "",
            ]
            if process_rate
            else []
        ),
        "| workers | per problem | spares | in flight | timed | candidates | server start s "
        "| sandbox verif/s | of bare | workers busy | host CPU busy | plain verif/s "
        "| sandbox/plain | sandbox verdicts | plain outcomes |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        ratio = f"{row.sandbox_rate / row.plain_rate:.2f}" if row.plain_rate else "n/a"
        cells = [
            str(row.workers),
            str(row.per_problem),
            str(row.spares),
            str(row.workers * row.in_flight),
            "yes" if row.timed else "no",
            str(row.count),
            f"{row.startup_s:.1f}",
            f"{row.sandbox_rate:.3f}",
            f"{100 * row.sandbox_rate / process_rate:.0f}%" if process_rate else "n/a",
            f"{100 * row.workers_busy:.0f}%" if row.workers_busy is not None else "n/a",
            f"{100 * row.cpu_busy:.0f}%" if row.cpu_busy is not None else "n/a",
            f"{row.plain_rate:.3f} ({row.plain_count})" if row.plain_s else "n/a",
            ratio,
            ", ".join(f"{k} {v}" for k, v in sorted(row.sandbox_verdicts.items())),
            ", ".join(f"{k} {v}" for k, v in sorted(row.plain_outcomes.items())) or "n/a",
        ]
        md.append("| " + " | ".join(cells) + " |")
    md += ["", "## Where the time goes (median / mean / max seconds per verification)", ""]
    md += stage_table(rows)
    md += ["", "## Timing fidelity", "", *fidelity_lines]
    if notes:
        md += ["", "## Not correct (every candidate should be)", ""]
        md += [f"- {n}" for n in notes[:50]]
    return "\n".join(md) + "\n"


def parse_lifecycle_rates(text: str) -> list[float]:
    """The context-only rates (processes a second) in `bench.cuda_lifecycles`' output."""
    return [float(m.group(1)) for m in re.finditer(r"^context -: ([0-9.]+)/s$", text, re.M)]


def cuda_process_rate(seconds: float = 4.0, in_flight: int = 8) -> float | None:
    """Bare CUDA processes a second on this machine (the median of two passes), or None.

    A subprocess of its own: this process must not start CUDA before forking its servers.
    """
    command = [sys.executable, "-m", "bench.cuda_lifecycles", "--steps", "context"]
    command += ["--seconds", str(seconds), "--in-flight", str(in_flight)]
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120 + 4 * seconds
        )
    except subprocess.TimeoutExpired:
        return None
    rates = parse_lifecycle_rates(proc.stdout)
    return statistics.median(rates) if proc.returncode == 0 and rates else None


def counts(text: str) -> list[int]:
    """A comma-separated list of positive integers (an argparse type)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 4,8: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers of at least 1: {text!r}")
    return values


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: count lists are checked here, before any server starts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small CPU-sized smoke run")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--workers", type=counts, default=None, help="comma-separated worker counts"
    )
    parser.add_argument(
        "--per-problem",
        type=counts,
        default=[8, 1],
        help="comma-separated candidates per problem (RL group size)",
    )
    parser.add_argument(
        "--spares",
        type=counts,
        default=[1],
        help="comma-separated candidate processes each worker keeps started ahead",
    )
    parser.add_argument(
        "--in-flight",
        type=counts,
        default=[2],
        help="comma-separated requests the client keeps in flight per worker (a group's "
        "first job measures the baselines, and its other answers wait for them)",
    )
    parser.add_argument(
        "--timing",
        choices=("on", "off", "both"),
        default="on",
        help="whether the throughput requests ask for timing; both: a row of each, to see "
        "what timing costs a verification (off on a CPU host either way)",
    )
    parser.add_argument("--candidates", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=10, help="timing-fidelity repeats")
    parser.add_argument("--allow-weak-isolation", action="store_true")
    parser.add_argument("--skip-plain", action="store_true", help="sandbox only")
    parser.add_argument(
        "--plain-candidates", type=int, default=None, help="run the plain harness on the first N"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="start no new row after this long"
    )
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip measuring the machine's bare CUDA processes a second (GPU only, ~12 s)",
    )
    parser.add_argument("--out", type=Path, help="write the markdown report here")
    parser.add_argument("--server-log", type=Path, help="append the servers' stderr here")
    return parser.parse_args(argv)


def write_case(workdir: Path, case: Case, stem: str) -> tuple[Path, Path]:
    """The case's problem and candidate as files: the plain harness imports them."""
    problem, candidate = workdir / f"{stem}_problem.py", workdir / f"{stem}_candidate.py"
    problem.write_text(case.problem)
    candidate.write_text(case.candidate)
    return problem, candidate


def write_cases(workdir: Path, cases: Iterable[Case]) -> dict[str, tuple[Path, Path]]:
    """Each case's files by name, numbered in order; a name seen before keeps its first files
    (the case sets of different group sizes can share names)."""
    files: dict[str, tuple[Path, Path]] = {}
    for case in cases:
        if case.name not in files:
            files[case.name] = write_case(workdir, case, str(len(files)))
    return files


@dataclass
class Fidelity:
    """The timing-fidelity kernels and their figures so far: the report is rewritten after
    each measurement, so a run cut short still shows what it had."""

    probe: Case  # one kernel verified `repeats` times: the spread of its medians
    same: Case  # eager relu's memory traffic in Triton: its speedup should read ~1.00
    identical: Case  # the problem runs the candidate's own kernel: 1.00 is exact
    repeats: int
    probe_ms: list[float] = field(default_factory=list)
    probe_plain_ms: list[float] = field(default_factory=list)
    same_speed: list[float] = field(default_factory=list)
    identical_speed: list[float] = field(default_factory=list)
    same_speed_loaded: list[float] = field(default_factory=list)
    loaded_jobs: int = 0  # load jobs the other workers verified during `same_speed_loaded`

    def lines(self) -> list[str]:
        """The report's timing-fidelity section, one bullet per check."""
        if self.repeats == 0:
            return ["- not measured (--repeats 0)"]
        no_timing = "n/a (no timing on this device)"
        return [
            f"- one kernel (`{self.probe.name}`) verified {self.repeats} times, candidate "
            "median ms: " + (spread(self.probe_ms) if self.probe_ms else no_timing),
            f"- the same kernel in the plain harness {self.repeats} times: "
            + (spread(self.probe_plain_ms) if self.probe_plain_ms else "n/a"),
            f"- same-speed check (Triton relu vs torch.relu, {self.same.name}), speedup vs "
            "eager: " + (spread(self.same_speed) if self.same_speed else no_timing),
            "- identical-kernel check (the problem runs the candidate's own Triton kernel: "
            "1.00 is exact), speedup vs eager: "
            + (spread(self.identical_speed) if self.identical_speed else no_timing),
            f"- same-speed check under load ({self.loaded_jobs} GiB elementwise jobs verified "
            "by the other workers meanwhile), speedup vs eager: "
            + (
                spread(self.same_speed_loaded)
                if self.same_speed_loaded
                else "n/a (no timing on this device, or one worker)"
            ),
        ]


def prepare_cases(
    workdir: Path, case_sets: dict[int, list[Case]], small: bool, repeats: int
) -> tuple[dict[str, tuple[Path, Path]], Fidelity]:
    """Every case written to `workdir` (for the plain harness), and the fidelity kernels."""
    same = same_speed_case(small)
    identical = identical_case(small)
    files = write_cases(
        workdir, [c for cases in case_sets.values() for c in cases] + [same, identical]
    )
    # Fidelity needs a kernel long enough to time (tens of microseconds on a GPU).
    first_set = next(iter(case_sets.values()))
    probe = first_set[0] if small else softmax_case((4096, 4096))
    if probe.name not in files:
        files[probe.name] = write_case(workdir, probe, "probe")
    return files, Fidelity(probe, same, identical, repeats)


def measure_reference(console: Console) -> float | None:
    """The machine's bare CUDA processes a second, measured before any server forks: the
    ceiling each row's rate is read against."""
    console.print("[bold]the machine's bare CUDA processes a second[/] ...")
    process_rate = cuda_process_rate()
    print(
        f"bare CUDA processes: {process_rate:.2f}/s"
        if process_rate
        else "bare CUDA processes: not measured (bench.cuda_lifecycles failed)",
        flush=True,
    )
    return process_rate


@dataclass
class Bench:
    """One run's settings and everything it has measured so far."""

    args: argparse.Namespace
    console: Console  # progress, on stderr
    device: str
    timing: bool  # the device can time kernels (CUDA)
    small: bool  # CPU-sized shapes
    files: dict[str, tuple[Path, Path]]  # each case's problem and candidate files, by name
    fidelity: Fidelity
    process_rate: float | None = None  # bare CUDA processes a second, if measured
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def report(self) -> str:
        """The markdown report of what has been measured so far."""
        return render(
            self.rows,
            self.device,
            self.timing,
            self.fidelity.lines(),
            self.notes,
            self.process_rate,
        )

    def save(self) -> None:
        """Write the report as it stands: called after every measurement, so none is lost."""
        if self.args.out:
            self.args.out.parent.mkdir(parents=True, exist_ok=True)
            self.args.out.write_text(self.report())


def account_results(row: Row, cases: list[Case], results: list[VerifyResult]) -> list[str]:
    """Add the server's answers to `row` (verdicts, job seconds, each stage's seconds and
    the time no stage accounts for); a note for each candidate that was not correct."""
    notes = []
    row.sandbox_verdicts = Counter(r.verdict for r in results)
    for case, result in zip(cases, results, strict=True):
        row.job_s += result.elapsed_s
        for name, seconds in result.stage_seconds.items():
            row.stages.setdefault(name, []).append(seconds)
        row.stages.setdefault("other", []).append(
            other_seconds(result.stage_seconds, result.elapsed_s)
        )
        if not result.correct:
            first = result.message.splitlines()[0] if result.message else ""
            notes.append(f"{row.workers} workers: {case.name}: {result.verdict}: {first}")
    return notes


def verify_row(client: Any, row: Row, cases: list[Case]) -> list[str]:
    """Verify the row's candidates, `in_flight` per worker at once, timing the whole and the
    host's CPU use; notes for those not correct."""
    items = [{"problem": c.problem, "candidate": c.candidate, "timing": row.timed} for c in cases]
    started = time.monotonic()
    busy_before, total_before = cpu_times()
    results = verify_logged(client, items, row.in_flight * row.workers)
    row.sandbox_s = time.monotonic() - started
    busy_after, total_after = cpu_times()
    if total_after > total_before:
        row.cpu_busy = (busy_after - busy_before) / (total_after - total_before)
    return account_results(row, cases, results)


def verify_speedups(bench: Bench, client: Any, case: Case, speeds: list[float]) -> None:
    """Verify `case` once per repeat, one job at a time, keeping its speedups vs eager."""
    for _ in range(bench.fidelity.repeats):
        r = client.verify(case.problem, case.candidate, timing=bench.timing)
        if r.speedup_vs_eager is not None:
            speeds.append(r.speedup_vs_eager)
        elif not r.correct:
            bench.notes.append(f"{case.name}: {r.verdict}: {r.message[:200]}")
        bench.save()


def measure_fidelity(bench: Bench, client: Any, workers: int) -> None:
    """Timing fidelity on the first, quietest server: one job at a time, then the
    same-speed check again while the other workers verify GiB kernels."""
    fidelity = bench.fidelity
    for _ in range(fidelity.repeats):
        r = client.verify(fidelity.probe.problem, fidelity.probe.candidate, timing=bench.timing)
        if r.candidate_ms is not None:
            fidelity.probe_ms.append(r.candidate_ms)
        bench.save()
    verify_speedups(bench, client, fidelity.same, fidelity.same_speed)
    # The identical kernel runs in the grader: only a GPU grader has Triton live.
    if bench.timing:
        verify_speedups(bench, client, fidelity.identical, fidelity.identical_speed)
    if bench.timing and workers > 1:
        # What a timed loop meets in a teacher or RL run.
        load = [
            {"problem": c.problem, "candidate": c.candidate, "timing": True}
            for c in load_cases(bench.small)
        ]
        fidelity.loaded_jobs = while_loaded(
            client,
            load,
            workers - 1,
            lambda: verify_speedups(bench, client, fidelity.same, fidelity.same_speed_loaded),
        )
        bench.save()


def run_row(bench: Bench, row: Row, cases: list[Case]) -> int:
    """One throughput row on a server of its own (fidelity too, on the first); the exit
    code: 2 if the server did not start."""
    from sandbox.client import SandboxClient

    bench.console.print(
        f"[bold]{row.workers} worker(s), {row.per_problem} per problem, {row.spares} spare(s), "
        f"{row.in_flight} in flight per worker{'' if row.timed else ', untimed'}[/]: "
        "sandbox server ..."
    )
    started = time.monotonic()
    try:
        server = Server(
            row.workers,
            bench.device,
            max(256, 4 * len(cases)),
            bench.args.allow_weak_isolation,
            bench.args.server_log,
            row.spares,
        )
    except RuntimeError as err:
        bench.console.print(f"drtriton: error: {err}", markup=False)
        return 2
    row.startup_s = time.monotonic() - started
    print(f"server up in {row.startup_s:.1f} s", flush=True)
    try:
        with SandboxClient(server.target, timeout_s=3600) as client:
            bench.notes.extend(verify_row(client, row, cases))
            bench.rows.append(row)
            bench.save()  # each measurement is written as soon as it exists
            if len(bench.rows) == 1:
                measure_fidelity(bench, client, row.workers)
    finally:
        code = server.stop()
        if code != 0:
            bench.notes.append(f"server with {row.workers} workers exited {code}")
    bench.save()
    return 0


def run_plain_row(bench: Bench, row: Row, cases: list[Case]) -> None:
    """The row's candidates (the first `--plain-candidates`) through the plain harness, as
    many processes at once as the server had workers: the sandbox's rate's comparison."""
    plain_cases = cases[: bench.args.plain_candidates or len(cases)]
    bench.console.print(
        f"[bold]{row.workers} worker(s)[/]: plain harness, {len(plain_cases)} candidates ..."
    )
    row.plain_s, row.plain_outcomes, _ = run_plain(
        plain_cases, bench.files, row.workers, bench.device
    )
    row.plain_count = len(plain_cases)
    bench.save()


def measure_plain_fidelity(bench: Bench) -> None:
    """The fidelity kernel in the plain harness, one process at a time: the spread of a
    harness without isolation, next to the sandbox's."""
    fidelity = bench.fidelity
    for _ in range(fidelity.repeats):
        _, _, [r] = run_plain([fidelity.probe], bench.files, 1, bench.device)
        if "candidate_ms" in r:
            fidelity.probe_plain_ms.append(r["candidate_ms"])


def run_rows(
    bench: Bench, case_sets: dict[int, list[Case]], worker_counts: list[int], began: float
) -> int:
    """A row for each combination of the count lists (and timing modes), until
    `--max-seconds`; the plain harness for the first group size and spare count. The
    exit code: 2 if a server did not start."""
    args = bench.args
    timing_modes = [
        m for m in (True, False) if bench.timing and args.timing in ("both", "on" if m else "off")
    ]
    for workers, group, spares, in_flight, timed in itertools.product(
        worker_counts, args.per_problem, args.spares, args.in_flight, timing_modes or [False]
    ):
        if args.max_seconds and time.monotonic() - began > args.max_seconds:
            bench.notes.append(f"skipped {workers} workers x {group}: past --max-seconds")
            continue
        cases = case_sets[group]
        row = Row(workers, group, count=len(cases), spares=spares, in_flight=in_flight, timed=timed)
        if code := run_row(bench, row, cases):
            return code
        if not args.skip_plain and group == args.per_problem[0] and spares == args.spares[0]:
            run_plain_row(bench, row, cases)
    return 0


def remove_workdir(workdir: Path) -> None:
    """Delete the case files and their directory; a leftover temp file fails no run."""
    with contextlib.suppress(OSError):
        for path in workdir.iterdir():
            path.unlink()
        workdir.rmdir()


def main(argv: list[str] | None = None) -> int:
    """Run the bench (or, as `_harness`, one plain-harness process); 2 if a server did not
    start."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_harness"]:
        return harness_main(argv[1:])
    args = parse_args(argv)

    from rich.console import Console

    from sandbox.config import resolve_device

    console = Console(stderr=True)
    began = time.monotonic()
    device = resolve_device(args.device)
    worker_counts = args.workers or ([1, 2] if args.quick else [1, 2, 4, 8, 16])
    count = args.candidates or (15 if args.quick else 200)  # 15: every template once
    repeats = 3 if args.quick else args.repeats
    small = args.quick or device == "cpu"
    timing = device == "cuda"

    workdir = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    case_sets = {g: generate_cases(count, small, per_problem=g) for g in args.per_problem}
    files, fidelity = prepare_cases(workdir, case_sets, small, repeats)
    process_rate = measure_reference(console) if timing and not args.no_reference else None
    bench = Bench(args, console, device, timing, small, files, fidelity, process_rate)
    if code := run_rows(bench, case_sets, worker_counts, began):
        return code
    if timing and not args.skip_plain:
        measure_plain_fidelity(bench)

    Console(soft_wrap=True).print(bench.report(), markup=False)
    bench.save()
    if args.out:
        console.print(f"wrote {args.out}")
    remove_workdir(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
