"""How many fresh CUDA processes one host starts per second: the ceiling of a sandbox
that gives every candidate its own process.

    python -m bench.cuda_startup --at-once 1,4,8,16 --rounds 3 --connections default,1

A candidate process is forked from a parent that has imported torch (the zygote), and
has to make its own CUDA context before it runs anything. Here N such forks start at
once, each timing `torch.cuda.init()`, its first allocation (which creates the context),
and the sandbox's timing clock (`sandbox.timing.bind_clock`: the L2 flush buffer, the
stream hold); the table gives the medians and the processes started per second, wall
clock from the first fork to the last exit. N = 1 is the baseline, measured in the same
command; so is the driver's default number of hardware queues per context
(`CUDA_DEVICE_MAX_CONNECTIONS`, 8), against the single queue candidates are given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

STEPS = ("cuda_init", "first_alloc", "bind_clock", "total")


def _child(write_fd: int, connections: str) -> None:
    """One candidate's start-up, timed step by step; never returns."""
    if connections != "default":
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    else:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    import torch

    from sandbox.timing import bind_clock

    marks: dict[str, float] = {}
    began = last = time.monotonic()
    for step, action in (
        ("cuda_init", torch.cuda.init),
        ("first_alloc", lambda: torch.empty(1, device="cuda")),
        ("bind_clock", lambda: bind_clock(1500.0)),  # a given spin rate, as candidates get
    ):
        action()
        now = time.monotonic()
        marks[step], last = now - last, now
    marks["total"] = last - began
    record = {**marks, "gpu": torch.cuda.get_device_name(0)}
    os.write(write_fd, (json.dumps(record) + "\n").encode())
    os._exit(0)


def start_round(at_once: int, connections: str = "default") -> tuple[float, list[dict[str, Any]]]:
    """Fork `at_once` children together; (wall seconds, each child's marks)."""
    read_fd, write_fd = os.pipe()
    began = time.monotonic()
    pids = []
    for _ in range(at_once):
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                _child(write_fd, connections)
            finally:
                os._exit(1)
        pids.append(pid)
    os.close(write_fd)
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
    wall = time.monotonic() - began
    with os.fdopen(read_fd) as lines:
        marks = [json.loads(line) for line in lines.read().splitlines()]
    if failed:
        raise RuntimeError(f"{failed} of {at_once} processes failed to start CUDA")
    return wall, marks


Row = tuple[str, int, list[float], list[dict[str, Any]]]


def render(rows: list[Row], gpu: str) -> str:
    """Markdown: per setting and N, processes per second and the median of each step."""
    lines = [
        f"# CUDA process start-up ({gpu})",
        "",
        "| connections | at once | rounds | processes/s | wall s | " + " | ".join(STEPS) + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(STEPS),
    ]
    for connections, at_once, walls, marks in rows:
        wall = statistics.median(walls)
        steps = " | ".join(f"{statistics.median(m[s] for m in marks):.3f}" for s in STEPS)
        lines.append(
            f"| {connections} | {at_once} | {len(walls)} | {at_once / wall:.1f} | {wall:.3f} "
            f"| {steps} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--at-once", default="1,4,8,16", help="comma list of processes started together"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per row (after a warm-up)")
    parser.add_argument(
        "--connections",
        default="default,1",
        help="comma list of CUDA_DEVICE_MAX_CONNECTIONS settings ('default': unset)",
    )
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.at_once.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--at-once takes whole numbers, not {args.at_once!r}")
    if not counts or min(counts) < 1 or args.rounds < 1:
        parser.error("--at-once needs counts >= 1 and --rounds >= 1")
    settings = [c.strip() for c in args.connections.split(",") if c.strip()]
    if not settings or any(
        c != "default" and not (c.isdigit() and 1 <= int(c) <= 32) for c in settings
    ):
        parser.error(
            f"--connections takes 'default' and counts from 1 to 32, not {args.connections!r}"
        )

    import torch  # noqa: F401 - imported before forking, as the zygote has it

    # The parent never touches CUDA (its children could not, after a fork): the warm-up
    # child finds out whether there is a GPU, and which.
    try:
        _, first = start_round(1)  # also a warm-up: an idle GPU's first context is slower
    except RuntimeError:
        print("error: this benchmark needs an NVIDIA GPU (CUDA did not start)", file=sys.stderr)
        return 2
    gpu = str(first[0]["gpu"])
    rows: list[Row] = []
    for connections in settings:
        for at_once in counts:
            walls, marks = [], []
            for _ in range(args.rounds):
                wall, round_marks = start_round(at_once, connections)
                walls.append(wall)
                marks.extend(round_marks)
            rows.append((connections, at_once, walls, marks))
    table = render(rows, gpu)
    print(table)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
