"""Verdicts for candidate kernels from the sandbox fleet: a thin layer over `sandbox.client`.

What it adds to `SandboxClient.verify_many` (which already spreads calls over the fleet,
bounds each with a deadline, retries UNAVAILABLE / RESOURCE_EXHAUSTED with backoff, and
answers `sandbox_error` for a job no server could judge):

- candidates that do not even parse are answered here (`syntax_error`), never sent;
- identical (problem, candidate) requests already judged come from a `VerdictCache`, and
  identical requests within one call are sent once (the copies count as cached);
- each problem's random inputs come from a seed fixed by (run seed, program id), so a
  verdict on the CPU sandbox is a function of the candidate alone (what makes a cache hit
  exact, and a resumed run's verdicts equal an uninterrupted run's);
- an exception from the client as a whole (a closed channel) becomes `sandbox_error`
  for every item of the call: masked by the trainer, never scored as a wrong kernel.

Records are plain dicts `{"verdict", "speedup_vs_eager", "source"}` with source one of
"sandbox", "cache", "rejected"; `learner.rl.rewards.verdict_arrays` reads them.
Nothing here imports torch or triton.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import logging
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from learner.rl.cache import VerdictCache, cache_key

log = logging.getLogger("drtriton.learner.rl")

# Verdict given to a candidate rejected before the sandbox (no code block, or not Python).
REJECTED_VERDICT = "syntax_error"


class SandboxUnreachableError(RuntimeError):
    """No sandbox server answered the health check: nothing would be judged."""


class VerifyManyClient(Protocol):
    """What the reward client needs of a sandbox client (`sandbox.client.SandboxClient`)."""

    def verify_many(
        self, items: Sequence[dict[str, Any]], *, concurrency: int = 32, progress: bool = False
    ) -> list[Any]: ...


@dataclasses.dataclass(frozen=True)
class Request:
    """One candidate to judge: the problem (functional PyTorch source) and the extracted code,
    None when the completion held no code block."""

    program_id: str
    problem: str
    code: str | None


@dataclasses.dataclass
class VerifyStats:
    """What one `judge` call did."""

    requests: int = 0
    rejected: int = 0  # did not parse: answered here
    cached: int = 0
    sent: int = 0
    sandbox_failures: int = 0  # sent, but the sandbox could not judge them
    seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def parses(code: str | None) -> bool:
    """Whether a candidate is worth sending: there is code, and it is valid Python."""
    if code is None or not code.strip():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # NUL bytes; deep nesting
        return False
    return True


# Servers take seeds below 2**48 (inputs come from seed + small offsets; torch seeds are
# 64-bit): `sandbox.runner.MAX_SEED`, which this module cannot import (it brings torch).
SEED_BITS = 48


def problem_seed(run_seed: int, program_id: str) -> int:
    """The input seed of one problem in one run: fixed, so verdicts repeat exactly."""
    digest = hashlib.sha256(f"{run_seed}:{program_id}".encode()).digest()
    return int.from_bytes(digest[: SEED_BITS // 8], "little")


def _record(verdict: str, speedup: float | None, source: str) -> dict[str, Any]:
    return {"verdict": verdict, "speedup_vs_eager": speedup, "source": source}


def result_record(result: Any) -> dict[str, Any]:
    """A `VerifyResult` as a verdict record (a speedup only for correct, timed kernels)."""
    speedup = result.speedup_vs_eager if result.verdict == "correct" else None
    if speedup is not None and not speedup > 0:
        speedup = None
    return _record(result.verdict, speedup, "sandbox")


class RewardClient:
    """Judges candidates: reject, cache, then the sandbox (see the module docstring)."""

    def __init__(
        self,
        client: VerifyManyClient,
        *,
        trials: int = 3,
        timing: bool = False,
        concurrency: int = 32,
        seed: int = 0,
        cache: VerdictCache | None = None,
    ) -> None:
        if trials < 1:
            raise ValueError("trials must be at least 1")
        self.client = client
        self.trials = trials
        self.timing = timing
        self.concurrency = concurrency
        self.seed = seed
        self.cache = cache if cache is not None else VerdictCache(0)

    def options(self, program_id: str) -> dict[str, Any]:
        """The request options of one problem (part of the cache key)."""
        return {
            "trials": self.trials,
            "timing": self.timing,
            "seed": problem_seed(self.seed, program_id),
            "format": "functional",
        }

    def judge(self, requests: Sequence[Request]) -> tuple[list[dict[str, Any]], VerifyStats]:
        """One verdict record per request, in order, and what it took."""
        started = time.perf_counter()
        stats = VerifyStats(requests=len(requests))
        records: list[dict[str, Any] | None] = [None] * len(requests)
        to_send: dict[str, dict[str, Any]] = {}  # key -> item, one per distinct request
        copies: dict[str, list[int]] = {}  # key -> the request indices it answers
        for index, request in enumerate(requests):
            if not parses(request.code):
                records[index] = _record(REJECTED_VERDICT, None, "rejected")
                stats.rejected += 1
                continue
            options = self.options(request.program_id)
            key = cache_key(request.problem, request.code or "", options)
            if key in to_send:  # the same request earlier in this call: judged once
                copies[key].append(index)
                continue
            hit = self.cache.get(key)
            if hit is not None:
                records[index] = {**hit, "source": "cache"}
                stats.cached += 1
                continue
            to_send[key] = {"problem": request.problem, "candidate": request.code, **options}
            copies[key] = [index]
        stats.sent = len(to_send)
        answers = self._send(list(to_send.values()))
        for key, record in zip(to_send, answers, strict=True):
            first, *others = copies[key]
            records[first] = record
            for index in others:
                records[index] = {**record, "source": "cache"}
            stats.cached += len(others)
            if record["verdict"] == "sandbox_error":
                stats.sandbox_failures += 1 + len(others)
            else:
                self.cache.put(key, record)
        stats.seconds = time.perf_counter() - started
        return [r for r in records if r is not None], stats

    def _send(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Verdict records for `items`. A job whose call deadline ran out while it waited
        behind others (a queue of slow candidates) is sent once more with a fresh deadline:
        masked, its reward would be lost, and a candidate that spins would be masked rather
        than judged `timeout`."""
        results = self._verify(items)
        late = [i for i, result in enumerate(results) if _cut_by_deadline(result)]
        if late and results:
            again = self._verify([items[i] for i in late])
            for index, result in zip(late, again, strict=True):
                results[index] = result
        failures = Counter(
            _reason(result) for result in results if _verdict(result) == "sandbox_error"
        )
        if failures:
            log.warning(
                "%d of %d candidates could not be judged: %s",
                sum(failures.values()),
                len(items),
                "; ".join(f"{n}x {why}" for why, n in failures.most_common(3)),
            )
        return [
            _record("sandbox_error", None, "sandbox") if result is None else result_record(result)
            for result in results
        ]

    def _verify(self, items: list[dict[str, Any]]) -> list[Any]:
        """The client's results for `items`, None for each when the call as a whole failed."""
        if not items:
            return []
        try:
            results = self.client.verify_many(items, concurrency=self.concurrency)
        except Exception as err:  # noqa: BLE001 - any failure of the fleet is masked, not fatal
            log.warning("sandbox call failed for %d candidates: %s", len(items), err)
            return [None] * len(items)
        if len(results) != len(items):
            log.warning("sandbox answered %d of %d candidates", len(results), len(items))
            return [None] * len(items)
        return list(results)


def _verdict(result: Any) -> str:
    return "sandbox_error" if result is None else result.verdict


def _reason(result: Any) -> str:
    if result is None:
        return "the call failed"
    return (getattr(result, "message", "") or "no message")[:120]


def _cut_by_deadline(result: Any) -> bool:
    """A job the call's deadline ended (it waited too long in the queue), not its own budget."""
    return (
        result is not None
        and result.verdict == "sandbox_error"
        and "DEADLINE_EXCEEDED" in (getattr(result, "message", "") or "")
    )


def check_reachable(client: Any, targets: Sequence[str], timeout_s: float = 10.0) -> None:
    """Raise `SandboxUnreachableError` unless a server of the fleet says SERVING in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        if client.health(timeout_s=max(0.5, min(5.0, deadline - time.monotonic()))):
            return
        if time.monotonic() >= deadline:
            raise SandboxUnreachableError(
                f"no sandbox server answered at {', '.join(targets)} within {timeout_s:.0f}s "
                "(start one with `drtriton sandbox serve`, or set sandbox.servers=local)"
            )
        time.sleep(0.5)
