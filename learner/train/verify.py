"""The learner's side of the sandbox: a client for the run's fleet, and pass@1.

The learner never imports torch or triton: kernels are judged by sandbox servers in other
processes, reached through `sandbox.client.SandboxClient`. With `sandbox.servers =
("local",)` a server is started as a subprocess for the run's lifetime (`drtriton sandbox
serve --port 0`), and stopped with SIGTERM (it drains) when the run ends; on Linux it also
gets SIGTERM when the thread that started it dies (start it from the main thread), so a
killed run leaves no server behind.

    with sandbox_client(cfg.sandbox) as client:          # SandboxUnreachable if not serving
        result = pass_at_1(client, problems, completions, trials=cfg.sandbox.trials)
        result.rate, result.correct, result.judged, result.sandbox_errors, ...

`verify_codes` is the lower level: one `VerifyResult` per (problem, code) pair, a missing
code (no `<triton_code>` block) answered locally as `no_code` without a request.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.train.config import SandboxConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
NO_CODE = "no_code"
LOCAL = "local"


class SandboxUnreachable(RuntimeError):
    """No sandbox server answers (or the local one would not start)."""


# --------------------------------------------------------------------------------------------
# A local server
# --------------------------------------------------------------------------------------------


# Runs the server with SIGTERM due to it when the process that started it dies (Linux's
# PR_SET_PDEATHSIG survives exec); if that process is already gone, it does not start.
_LAUNCHER = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def _with_parent_watch(args: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return args
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *args[1:]]


def _pump(stream: Any, lines: queue.Queue[str | None], keep: list[str]) -> None:
    for line in stream:
        keep.append(line)
        lines.put(line)
    lines.put(None)


@contextlib.contextmanager
def start_local_sandbox(
    *,
    workers: int = 2,
    device: str = "auto",
    allow_weak_isolation: bool = False,
    start_timeout_s: float = 300.0,
    stop_timeout_s: float = 120.0,
) -> Iterator[str]:
    """A `drtriton sandbox serve` subprocess on loopback; yields its "127.0.0.1:PORT"."""
    args = [
        sys.executable,
        "-m",
        "drtriton_cli",
        "sandbox",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--device",
        device,
        "--workers",
        str(workers),
    ]
    if allow_weak_isolation:
        args.append("--allow-weak-isolation")
    proc = subprocess.Popen(
        _with_parent_watch(args),
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out: queue.Queue[str | None] = queue.Queue()
    stdout: list[str] = []
    stderr: list[str] = []
    readers = [
        threading.Thread(target=_pump, args=(proc.stdout, out, stdout), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, queue.Queue(), stderr), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        try:
            first = out.get(timeout=start_timeout_s)
        except queue.Empty:
            first = None
        prefix = "listening on "
        if first is None or not first.startswith(prefix):
            tail = "".join(stderr).strip().splitlines()[-1:] or ["no output"]
            raise SandboxUnreachable(f"the local sandbox server did not start: {tail[0]}")
        port = first[len(prefix) :].strip().rsplit(":", 1)[1]
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc, stop_timeout_s)


def _stop(proc: subprocess.Popen[str], timeout_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@contextlib.contextmanager
def sandbox_client(cfg: SandboxConfig, *, health_timeout_s: float = 10.0) -> Iterator[Any]:
    """A `SandboxClient` of the configured fleet (starting a local server for "local"),
    checked to be serving: `SandboxUnreachable` (one line) otherwise."""
    from sandbox.client import SandboxClient

    with contextlib.ExitStack() as stack:
        if tuple(cfg.servers) == (LOCAL,):
            targets: list[str] = [
                stack.enter_context(
                    start_local_sandbox(
                        workers=cfg.workers,
                        device=cfg.device,
                        allow_weak_isolation=cfg.allow_weak_isolation,
                    )
                )
            ]
        else:
            targets = list(cfg.servers)
        try:
            client = SandboxClient(targets, timeout_s=cfg.timeout_s, max_retries=cfg.retries)
        except ValueError as err:
            raise SandboxUnreachable(f"sandbox.servers: {err}") from None
        stack.callback(client.close)
        if not client.health(timeout_s=health_timeout_s):
            raise SandboxUnreachable(
                f"no sandbox server serving at {', '.join(targets)} (sandbox.servers)"
            )
        yield client


# --------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------


def verify_codes(
    client: Any,
    problems: Sequence[str],
    codes: Sequence[str | None],
    *,
    trials: int = 3,
    timing: bool = False,
    concurrency: int = 32,
    seed: int | None = None,
) -> list[Any]:
    """One `VerifyResult` per (problem, code); `None` codes become verdict `no_code` locally.
    Never raises for an item: an unjudgeable one is `sandbox_error` (mask it, don't score it)."""
    from sandbox.result import VerifyResult

    if len(problems) != len(codes):
        raise ValueError(f"{len(problems)} problems but {len(codes)} codes")
    items = [
        {"problem": p, "candidate": c, "trials": trials, "timing": timing, "seed": seed}
        for p, c in zip(problems, codes, strict=True)
        if c is not None
    ]
    judged = iter(client.verify_many(items, concurrency=concurrency))
    return [
        next(judged) if c is not None else VerifyResult(verdict=NO_CODE, message="no code block")
        for c in codes
    ]


@dataclass
class PassAt1:
    """pass@1 over problems: `rate` = correct / judged, where judged leaves out the problems
    the sandbox could not judge (`sandbox_error`, `bad_problem`), which are counted apart."""

    total: int = 0
    correct: int = 0
    judged: int = 0
    sandbox_errors: int = 0
    no_code: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.correct / self.judged if self.judged else float("nan")

    def metrics(self) -> dict[str, float]:
        return {
            "pass_at_1": self.rate,
            "pass_at_1_correct": self.correct,
            "pass_at_1_judged": self.judged,
            "pass_at_1_sandbox_errors": self.sandbox_errors,
            "pass_at_1_no_code": self.no_code,
        }


def summarize(results: Sequence[Any]) -> PassAt1:
    """Counts of a list of `VerifyResult`s (one per problem)."""
    from sandbox.result import INFRASTRUCTURE_VERDICTS

    verdicts = Counter(r.verdict for r in results)
    masked = sum(verdicts[v] for v in INFRASTRUCTURE_VERDICTS)
    return PassAt1(
        total=len(results),
        correct=verdicts["correct"],
        judged=len(results) - masked,
        sandbox_errors=masked,
        no_code=verdicts[NO_CODE],
        verdicts=dict(verdicts),
    )


def pass_at_1(
    client: Any,
    problems: Sequence[str],
    completions: Sequence[str],
    *,
    trials: int = 3,
    timing: bool = False,
    concurrency: int = 32,
    seed: int | None = None,
) -> PassAt1:
    """Extract each completion's code (`synth.teacher.prompt.extract_code`), judge it against
    its problem, count. One completion per problem."""
    from synth.teacher.prompt import extract_code

    codes = [extract_code(text) for text in completions]
    results = verify_codes(
        client, problems, codes, trials=trials, timing=timing, concurrency=concurrency, seed=seed
    )
    return summarize(results)
