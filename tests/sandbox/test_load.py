"""Bounded load: many clients, a mix of good, bad, crashing and hanging candidates.

Every request gets exactly one answer with the right verdict, nothing is judged as
an infrastructure failure, and afterwards the server's process tree (count and
memory) is back to where it started and the server is healthy.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.client import SandboxClient
from sandbox.result import VerifyResult
from tests.sandbox.conftest import (
    ABORTING,
    CRASHING,
    GOOD_RELU,
    HANGING,
    NO_ENTRY_POINT,
    NO_TRITON_KERNEL,
    RELU_PROBLEM,
    SYNTAX_ERROR,
    WRONG_RELU,
    ServerProcess,
    tree_usage,
    wait_until,
)

CLIENTS = 8
# (candidate, expected verdict, how many): 200 requests. On CPU every candidate that
# runs costs a fresh process importing torch and Triton (seconds), so most are fast
# failures (they still pass through a grader worker), plus real runs of every kind.
MIX = [
    (SYNTAX_ERROR, "syntax_error", 72),
    (NO_ENTRY_POINT, "no_entry_point", 62),
    (NO_TRITON_KERNEL, "no_triton_kernel", 55),
    (GOOD_RELU, "correct", 4),
    (WRONG_RELU, "wrong_output", 2),
    (CRASHING, "runtime_error", 2),
    (ABORTING, "runtime_error", 1),
    (HANGING, "timeout", 2),
]
# The same with a fifth of the requests really running (`make test-slow`).
FULL_MIX = [
    (SYNTAX_ERROR, "syntax_error", 120),
    (NO_ENTRY_POINT, "no_entry_point", 100),
    (NO_TRITON_KERNEL, "no_triton_kernel", 80),
    (GOOD_RELU, "correct", 40),
    (WRONG_RELU, "wrong_output", 20),
    (CRASHING, "runtime_error", 15),
    (ABORTING, "runtime_error", 10),
    (HANGING, "timeout", 15),
]
HANG_BUDGET_S = 2.0
# Memory may settle a little higher (allocator caches, imported modules); a leaked
# candidate process or a growing grader would exceed this by far.
RSS_SLACK = 1.25
RSS_SLACK_BYTES = 150 * 2**20


def settled_usage(pid: int, timeout_s: float = 90) -> tuple[int, int]:
    """Process count and RSS once two samples a second apart agree (pre-starts done)."""
    deadline = time.monotonic() + timeout_s
    previous = tree_usage(pid)
    while True:
        time.sleep(1.0)
        current = tree_usage(pid)
        if current[0] == previous[0] and abs(current[1] - previous[1]) < 0.02 * previous[1]:
            return current
        if time.monotonic() > deadline:
            return current
        previous = current


@pytest.mark.parametrize(
    "mix", [MIX, pytest.param(FULL_MIX, marks=pytest.mark.slow)], ids=["ci", "full"]
)
def test_many_clients_mixed_candidates(
    mix: list[tuple[str, str, int]], sandbox_server_process: ServerProcess
) -> None:
    """On the session server (two workers), which must end as it started."""
    jobs: list[dict] = []
    expected: dict[str, str] = {}
    for candidate, verdict, count in mix:
        for _ in range(count):
            request_id = f"{verdict}-{len(jobs)}"
            expected[request_id] = verdict
            job = {
                "problem": RELU_PROBLEM,
                "candidate": candidate,
                "request_id": request_id,
                "timing": False,
                "trials": 3,
            }
            if verdict == "timeout":
                job["time_budget_s"] = HANG_BUDGET_S
            jobs.append(job)
    assert len(jobs) >= 200
    random.Random(0).shuffle(jobs)

    server = sandbox_server_process
    with SandboxClient(server.target, timeout_s=120) as warm:
        assert warm.verify(RELU_PROBLEM, GOOD_RELU, timing=False).verdict == "correct"
        base_count, base_rss = settled_usage(server.pid)
        done_before = warm.info().jobs_done

        results: list[list[VerifyResult]] = [[] for _ in range(CLIENTS)]
        errors: list[BaseException] = []

        def client(k: int) -> None:
            try:
                with SandboxClient(server.target, timeout_s=300) as sandbox:
                    results[k] = sandbox.verify_many(jobs[k::CLIENTS], concurrency=4)
            except BaseException as err:  # noqa: BLE001 - re-raised in the test thread
                errors.append(err)

        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        elapsed = time.monotonic() - started
        assert not errors, errors

        answers = [r for chunk in results for r in chunk]
        ids = Counter(r.request_id for r in answers)
        assert len(answers) == len(jobs) and set(ids) == set(expected)
        assert max(ids.values()) == 1, "a request was answered twice"
        wrong = [
            (r.request_id, r.verdict, r.message)
            for r in answers
            if r.verdict != expected[r.request_id]
        ]
        summary = Counter((expected[rid], got) for rid, got, _ in wrong)
        assert not wrong, (
            f"{len(wrong)} of {len(jobs)} misjudged {dict(summary)}; first: {wrong[:3]}"
        )

        info = warm.info()
        assert info.jobs_done - done_before == len(jobs)
        assert info.busy_workers == 0 and info.queue_depth == 0
        with grpc.insecure_channel(server.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING

        wait_until(
            lambda: tree_usage(server.pid)[0] == base_count, 90, "the process count to settle"
        )
        count, rss = settled_usage(server.pid)
        assert count == base_count
        assert rss <= base_rss * RSS_SLACK + RSS_SLACK_BYTES, (
            f"RSS {rss / 2**20:.0f} MiB after, {base_rss / 2**20:.0f} MiB before"
        )
        print(
            f"{len(jobs)} jobs from {CLIENTS} clients in {elapsed:.1f}s; "
            f"processes {base_count} -> {count}; "
            f"RSS {base_rss / 2**20:.0f} -> {rss / 2**20:.0f} MiB"
        )
