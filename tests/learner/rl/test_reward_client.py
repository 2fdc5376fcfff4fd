"""The reward client: rejection before sending, the verdict cache, retries and masking of
sandbox failures (through real gRPC: a flaky in-process server, and a port nobody serves)."""

from __future__ import annotations

import socket
import threading
from concurrent import futures
from typing import Any

import grpc
import pytest

from learner.rl.cache import VerdictCache, cache_key
from learner.rl.reward_client import (
    Request,
    RewardClient,
    SandboxUnreachableError,
    check_reachable,
    parses,
    problem_seed,
)
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.client import SandboxClient
from sandbox.result import VerifyResult

GOOD = "import triton\n\ndef triton_fused_operator(x):\n    return [x]\n"
PROBLEM = "import torch\n\ndef fused_operator(x):\n    return [x]\n"
FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05}


class FakeClient:
    """Answers every item with a fixed verdict and remembers what it was sent."""

    def __init__(self, verdict: str = "correct", fail: bool = False) -> None:
        self.verdict = verdict
        self.fail = fail
        self.sent: list[dict[str, Any]] = []

    def verify_many(self, items, *, concurrency=32, progress=False):
        if self.fail:
            raise RuntimeError("channel closed")
        self.sent.extend(items)
        return [self._result() for _ in items]

    def _result(self) -> VerifyResult:
        speedups = getattr(self, "speedups", None)
        if speedups is None:
            return VerifyResult(verdict=self.verdict)
        return VerifyResult(verdict=self.verdict, speedup_vs_eager=next(speedups))


def test_unparsable_candidates_are_rejected_without_a_call() -> None:
    fake = FakeClient()
    client = RewardClient(fake, seed=3)
    requests = [
        Request("p", PROBLEM, None),  # no code block
        Request("p", PROBLEM, "def broken(:\n"),
        Request("p", PROBLEM, "   \n"),
        Request("p", PROBLEM, GOOD),
    ]
    records, stats = client.judge(requests)
    assert [r["verdict"] for r in records] == ["syntax_error"] * 3 + ["correct"]
    assert [r["source"] for r in records] == ["rejected"] * 3 + ["sandbox"]
    assert (stats.rejected, stats.sent, stats.cached) == (3, 1, 0)
    assert len(fake.sent) == 1
    sent = fake.sent[0]
    assert sent["candidate"] == GOOD and sent["problem"] == PROBLEM
    assert sent["seed"] == problem_seed(3, "p") and sent["format"] == "functional"
    assert parses(GOOD) and not parses("x = (")


def test_identical_pairs_come_from_the_cache_and_failures_are_not_cached() -> None:
    fake = FakeClient()
    client = RewardClient(fake, cache=VerdictCache(8))
    first, _ = client.judge([Request("p", PROBLEM, GOOD)])
    records, stats = client.judge([Request("p", PROBLEM, GOOD), Request("q", PROBLEM, GOOD)])
    # Another program id is another input seed: another request.
    assert [r["source"] for r in records] == ["cache", "sandbox"]
    assert records[0]["verdict"] == first[0]["verdict"] == "correct"
    assert (stats.cached, stats.sent) == (1, 1) and len(fake.sent) == 2

    failing = RewardClient(FakeClient("sandbox_error"), cache=VerdictCache(8))
    failing.judge([Request("p", PROBLEM, GOOD)])
    _, stats = failing.judge([Request("p", PROBLEM, GOOD)])
    assert (stats.cached, stats.sandbox_failures) == (0, 1)


def test_cache_is_bounded_and_least_recently_used_goes_first() -> None:
    cache = VerdictCache(2)
    keys = [cache_key("p", f"c{i}", {"trials": 1}) for i in range(3)]
    cache.put(keys[0], {"verdict": "correct"})
    cache.put(keys[1], {"verdict": "wrong_output"})
    assert cache.get(keys[0]) is not None  # 0 is now the most recent
    cache.put(keys[2], {"verdict": "correct"})
    assert len(cache) == 2 and cache.get(keys[1]) is None and cache.get(keys[0]) is not None
    assert cache_key("p", "c", {"seed": 1}) != cache_key("p", "c", {"seed": 2})
    assert cache_key("ab", "c", {}) != cache_key("a", "bc", {})
    off = VerdictCache(0)
    off.put(keys[0], {"verdict": "correct"})
    assert off.get(keys[0]) is None


def test_a_client_that_raises_masks_every_item() -> None:
    records, stats = RewardClient(FakeClient(fail=True)).judge([Request("p", PROBLEM, GOOD)] * 3)
    assert [r["verdict"] for r in records] == ["sandbox_error"] * 3
    assert stats.sandbox_failures == 3


# -- real gRPC ----------------------------------------------------------------------------------


class FlakyServicer(sandbox_pb2_grpc.SandboxServicer):
    """UNAVAILABLE for the first `failures` calls, then `correct`."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.lock = threading.Lock()

    def Verify(self, request, context):  # noqa: N802 - gRPC method name
        with self.lock:
            self.calls += 1
            fail = self.calls <= self.failures
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        return VerifyResult(verdict="correct", request_id=request.request_id).to_proto()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def flaky_server():
    servicer = FlakyServicer(failures=2)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    sandbox_pb2_grpc.add_SandboxServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def test_retries_reach_a_verdict_after_unavailable(flaky_server) -> None:
    servicer, target = flaky_server
    retries: list[int] = []
    with SandboxClient(
        target, timeout_s=30, max_retries=4, on_retry=lambda a, c, d: retries.append(a), **FAST
    ) as sandbox:
        records, stats = RewardClient(sandbox, concurrency=1).judge([Request("p", PROBLEM, GOOD)])
    assert records[0]["verdict"] == "correct" and stats.sandbox_failures == 0
    assert retries == [1, 2] and servicer.calls == 3


def test_retries_that_run_out_are_masked_not_scored(flaky_server) -> None:
    servicer, target = flaky_server
    servicer.failures = 100
    with SandboxClient(target, timeout_s=30, max_retries=1, **FAST) as sandbox:
        records, stats = RewardClient(sandbox, concurrency=2).judge(
            [Request("p", PROBLEM, GOOD), Request("q", PROBLEM, GOOD)]
        )
    assert [r["verdict"] for r in records] == ["sandbox_error"] * 2
    assert stats.sandbox_failures == 2


def test_a_server_that_is_down_is_a_sandbox_failure_and_fails_the_start_check() -> None:
    target = f"127.0.0.1:{_free_port()}"
    with SandboxClient(target, timeout_s=5, max_retries=1, **FAST) as sandbox:
        records, stats = RewardClient(sandbox).judge([Request("p", PROBLEM, GOOD)])
        assert records[0]["verdict"] == "sandbox_error" and stats.sandbox_failures == 1
        with pytest.raises(SandboxUnreachableError, match="no sandbox server answered"):
            check_reachable(sandbox, [target], timeout_s=1)


def test_seeds_are_ones_the_sandbox_takes() -> None:
    """A seed the server refuses would make every sample `sandbox_error`: all masked, and
    the run would learn nothing without failing."""
    from sandbox.runner import MAX_SEED

    seeds = [problem_seed(run, f"prog-{i}") for run in (0, 7, 2**40) for i in range(200)]
    assert max(seeds) < MAX_SEED and len(set(seeds)) == len(seeds)


def test_deeply_nested_code_is_rejected_not_raised() -> None:
    """A completion nested past the parser's limit must be scored wrong, not crash the run."""
    assert not parses("x = " + "-" * 5000 + "1\n")
    assert not parses("x = " + "(" * 500 + ")" * 500 + "\n")


class DeadlineThenAnswer:
    """Cuts the first call's jobs by their deadline (queued behind slow ones), then judges."""

    def __init__(self) -> None:
        self.calls = 0

    def verify_many(self, items, *, concurrency=32, progress=False):
        self.calls += 1
        if self.calls == 1:
            message = "DEADLINE_EXCEEDED: the call's deadline (20.0s) ended the job"
            return [VerifyResult(verdict="sandbox_error", message=message) for _ in items]
        return [VerifyResult(verdict="timeout") for _ in items]


def test_a_job_cut_by_its_call_deadline_is_sent_once_more() -> None:
    """Masked, a spinning candidate (or an honest one queued behind it) would escape its
    verdict: sent again with a fresh deadline it gets `timeout`, scored as wrong."""
    fake = DeadlineThenAnswer()
    records, stats = RewardClient(fake).judge([Request("p", PROBLEM, GOOD)])
    assert fake.calls == 2
    assert records[0]["verdict"] == "timeout" and stats.sandbox_failures == 0


def test_a_timed_verdict_is_served_only_after_several_timings_as_their_median() -> None:
    """On a GPU a kernel's speedup varies from one verification to the next: a kernel the
    policy writes again is timed `timings_per_kernel` times before the cache answers for
    it, and then with the median, not its first (perhaps lucky) figure."""
    cache = VerdictCache(8, timings_per_kernel=3)
    key = cache_key("p", "c", {"timing": True})
    for speedup in (9.0, 1.0):
        assert cache.get(key) is None  # not enough timings yet: judged again
        cache.put(key, {"verdict": "correct", "speedup_vs_eager": speedup})
    assert cache.retimes == 2 - 1  # the first lookup was a plain miss
    assert cache.get(key) is None
    cache.put(key, {"verdict": "correct", "speedup_vs_eager": 1.2})
    assert cache.get(key) == {"verdict": "correct", "speedup_vs_eager": 1.2}
    # A correct verdict left untimed once keeps the figures; a new verdict replaces them.
    cache.put(key, {"verdict": "correct", "speedup_vs_eager": None})
    assert cache.get(key) == {"verdict": "correct", "speedup_vs_eager": 1.2}
    cache.put(key, {"verdict": "wrong_output", "speedup_vs_eager": None})
    assert cache.get(key) == {"verdict": "wrong_output", "speedup_vs_eager": None}
    # Untimed verdicts (the CPU sandbox) are served from the first.
    plain = cache_key("p", "c", {"timing": False})
    cache.put(plain, {"verdict": "correct", "speedup_vs_eager": None})
    assert cache.get(plain) is not None
    with pytest.raises(ValueError, match="at least 1"):
        VerdictCache(8, timings_per_kernel=0)


def test_the_client_sends_a_timed_kernel_again_until_its_timings_are_in() -> None:
    timed = FakeClient()
    timed.speedups = iter([2.0, 4.0, 3.0])
    client = RewardClient(timed, timing=True, cache=VerdictCache(8, timings_per_kernel=3))
    request = Request("p", PROBLEM, GOOD)
    figures = [client.judge([request])[0][0]["speedup_vs_eager"] for _ in range(5)]
    assert figures == [2.0, 4.0, 3.0, 3.0, 3.0] and len(timed.sent) == 3
