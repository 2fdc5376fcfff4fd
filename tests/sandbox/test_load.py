"""Load on a served sandbox: many clients, honest, cheating, crashing and hanging candidates.

Every request gets exactly one answer of the right class (an honest kernel `correct`, a
cheat some rejection, never `correct`; nothing at all `sandbox_error`), and afterwards
nothing is left behind: while the server runs, its process tree (count and memory) and its
job directories are back to where they started; once it has stopped, no process of it or of
its candidates, no cgroup of its jobs, no job directory and no GPU memory remains.

Leftovers are told apart from those of other sandboxes on the host by the names of this
server's job directories (each job's cgroups carry its directory's name), collected while
it runs.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.client import SandboxClient
from sandbox.result import VerifyResult
from tests.sandbox.cases.manifest import CASES_DIR, VERDICT_NAMES, parse_header
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
    running_server,
    tree_usage,
    wait_until,
)

CLIENTS = 8
HANG_BUDGET_S = 2.0
# Memory may settle a little higher (allocator caches, imported modules); a leaked
# candidate process or a growing grader would exceed this by far.
RSS_SLACK = 1.25
RSS_SLACK_BYTES = 150 * 2**20
GPU_SLACK_BYTES = 256 * 2**20
JOB_DIR_NAME = re.compile(r"^[0-9a-f]{16}$")  # `CandidateProcess`: uuid4().hex[:16]
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_GROUP = "drtriton"  # `sandbox.jail.cgroup.GROUP`: <hierarchy>/drtriton/<job dir name>
REJECTIONS = VERDICT_NAMES - {"correct"}  # every verdict on the candidate that refuses it


@dataclass(frozen=True)
class Kind:
    """A class of candidate and the verdicts that answer it rightly."""

    name: str
    verdicts: frozenset[str]


HONEST = Kind("honest", frozenset({"correct"}))
CHEAT = Kind("cheat", REJECTIONS)  # the gate or a check may catch it: any rejection
CRASH = Kind("crash", frozenset({"runtime_error"}))
HANG = Kind("hang", frozenset({"timeout"}))


@dataclass(frozen=True)
class Sample:
    """One candidate of the mix: its source, problem, options and the verdicts it may get."""

    label: str
    candidate: str
    problem: str
    verdicts: frozenset[str]
    options: tuple[tuple[str, float], ...] = ()


def inline(label: str, candidate: str, verdicts: set[str] | Kind) -> Sample:
    allowed = verdicts.verdicts if isinstance(verdicts, Kind) else frozenset(verdicts)
    options = (("time_budget_s", HANG_BUDGET_S),) if allowed == HANG.verdicts else ()
    return Sample(label, candidate, RELU_PROBLEM, allowed, options)


def case(path: str, kind: Kind) -> Sample:
    """A candidate of the case catalogue: its header's verdicts, and for a cheat any
    rejection (the static gate may refuse what a check used to catch)."""
    header = parse_header(CASES_DIR / path)
    allowed = frozenset(header.expect)
    if kind is CHEAT:
        assert "correct" not in allowed, f"{path} is no cheat"
        allowed = kind.verdicts
    elif kind is HONEST:
        assert allowed == HONEST.verdicts, f"{path} is not honest"
    options = tuple((k, float(v)) for k, v in header.options.items())
    return Sample(path, header.candidate_source(), header.problem_source(), allowed, options)


def samples() -> dict[str, Sample]:
    found = [
        # Answered before any candidate code runs (parse, entry point, static gate).
        inline("syntax_error", SYNTAX_ERROR, {"syntax_error"}),
        inline("no_entry_point", NO_ENTRY_POINT, {"no_entry_point"}),
        case("adversarial/fallback_numpy.py", CHEAT),  # import numpy
        case("adversarial/pipe_forgery.py", CHEAT),  # writes a reply onto the grader's pipe
        case("adversarial/cache_across_calls.py", CHEAT),  # output caching
        case("adversarial/tamper_guard_module.py", CHEAT),
        # Run: honest kernels, cheats that a check catches, crashes and hangs.
        inline("good_relu", GOOD_RELU, HONEST),
        case("honest/elementwise.py", HONEST),
        case("honest/row_sum.py", HONEST),
        inline("wrong_relu", WRONG_RELU, CHEAT),
        inline("no_triton_kernel", NO_TRITON_KERNEL, CHEAT),
        case("adversarial/fallback_operators.py", CHEAT),  # torch fallback
        case("adversarial/input_mutation_scratch.py", CHEAT),  # input mutation
        case("adversarial/return_input.py", CHEAT),
        case("adversarial/nan_output.py", CHEAT),
        inline("crashing", CRASHING, CRASH),
        inline("aborting", ABORTING, CRASH),
        case("adversarial/raises_at_call.py", CRASH),
        inline("hanging", HANGING, HANG),
    ]
    return {sample.label: sample for sample in found}


# (label, count): the default run, 200 requests, 75 of them run by a candidate process
# (the zygote's forks make that cheap even on the CPU); the rest are answered before any
# candidate code runs, but still pass through a grader worker.
MIX = {
    "syntax_error": 35,
    "no_entry_point": 25,
    "adversarial/fallback_numpy.py": 20,
    "adversarial/pipe_forgery.py": 20,
    "adversarial/cache_across_calls.py": 15,
    "adversarial/tamper_guard_module.py": 15,
    "good_relu": 10,
    "honest/elementwise.py": 5,
    "honest/row_sum.py": 5,
    "wrong_relu": 5,
    "no_triton_kernel": 5,
    "adversarial/fallback_operators.py": 5,
    "adversarial/input_mutation_scratch.py": 5,
    "adversarial/return_input.py": 5,
    "adversarial/nan_output.py": 5,
    "crashing": 5,
    "aborting": 5,
    "adversarial/raises_at_call.py": 5,
    "hanging": 5,
}
# 1,000 requests, a fifth of them run (`make test-slow`).
FULL_MIX = {
    "syntax_error": 200,
    "no_entry_point": 160,
    "adversarial/fallback_numpy.py": 120,
    "adversarial/pipe_forgery.py": 120,
    "adversarial/cache_across_calls.py": 100,
    "adversarial/tamper_guard_module.py": 100,
    "good_relu": 40,
    "honest/elementwise.py": 20,
    "honest/row_sum.py": 20,
    "wrong_relu": 10,
    "no_triton_kernel": 10,
    "adversarial/fallback_operators.py": 15,
    "adversarial/input_mutation_scratch.py": 15,
    "adversarial/return_input.py": 10,
    "adversarial/nan_output.py": 10,
    "crashing": 10,
    "aborting": 10,
    "adversarial/raises_at_call.py": 10,
    "hanging": 20,
}


def build_jobs(mix: dict[str, int]) -> tuple[list[dict], dict[str, Sample]]:
    """The requests of `mix`, shuffled, and the sample each request id stands for."""
    known = samples()
    jobs: list[dict] = []
    expected: dict[str, Sample] = {}
    for label, count in mix.items():
        sample = known[label]
        for _ in range(count):
            request_id = f"{len(jobs)}-{label}"
            expected[request_id] = sample
            jobs.append(
                {
                    "problem": sample.problem,
                    "candidate": sample.candidate,
                    "request_id": request_id,
                    "timing": False,
                    "trials": 3,
                    **dict(sample.options),
                }
            )
    random.Random(0).shuffle(jobs)
    return jobs, expected


# -- what a sandbox leaves behind ---------------------------------------------------------


def runner_roots(server_pid: int) -> list[Path]:
    """The server's job root (`JobRunner`: <job root>/runner-<pid>-<hex>, on /dev/shm or
    in the temporary directory, `config.default_job_root`)."""
    import tempfile

    roots = []
    for base in (Path("/dev/shm/drtriton-jobs"), Path(tempfile.gettempdir()) / "drtriton-jobs"):
        roots += base.glob(f"runner-{server_pid}-*")
    return roots


def job_dirs(roots: list[Path]) -> set[str]:
    """Names of the job directories under the server's job root (one per GPU with several)."""
    names: set[str] = set()
    for root in roots:
        with contextlib.suppress(OSError):
            for path in [*root.iterdir(), *root.glob("gpu-*/*")]:
                if JOB_DIR_NAME.match(path.name) and path.is_dir():
                    names.add(path.name)
    return names


def job_cgroups(names: set[str]) -> list[Path]:
    """The cgroup directories of these jobs, in every hierarchy (`sandbox.jail.cgroup`)."""
    return [p for p in CGROUP_ROOT.glob(f"*/{CGROUP_GROUP}/*") if p.name in names] + [
        p for p in CGROUP_ROOT.glob(f"{CGROUP_GROUP}/*") if p.name in names
    ]


class Watcher:
    """Notes, while the server runs, the names of its job directories and the processes of
    its tree: what may be left behind, and what to look for afterwards."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.names: set[str] = set()
        self.pids: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            self.names |= job_dirs(runner_roots(self.server.pid))
            with contextlib.suppress(psutil.Error):
                self.pids |= {p.pid for p in psutil.Process(self.server.pid).children(True)}
            self._done.wait(0.02)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(10)


def candidate_uid() -> int | None:
    """The user candidates run as, where it is not this test's own (`isolation.candidate_uid`)."""
    from sandbox.isolation import candidate_uid as jail_uid

    uid = jail_uid()
    return None if uid == os.geteuid() else uid


def leftover_processes(watcher: Watcher, started: float) -> list[str]:
    """Live processes of the stopped server: of its tree, in its jobs' cgroups, or of the
    candidates' user, started meanwhile, orphaned (their parent is init) and in no job's
    cgroup: one that escaped both."""
    uid = candidate_uid()
    left = []
    for proc in psutil.process_iter(["pid", "ppid", "uids", "create_time", "status", "cmdline"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        why = ""
        if info["pid"] in watcher.pids or info["pid"] == watcher.server.pid:
            why = "of the server's tree"
        elif uid is not None and info["uids"] and info["uids"].real == uid:
            with contextlib.suppress(OSError):
                groups = Path(f"/proc/{info['pid']}/cgroup").read_text()
                if any(name in groups for name in watcher.names):
                    why = "in one of its jobs' cgroups"
                elif (
                    CGROUP_GROUP not in groups
                    and info["ppid"] == 1
                    and info["create_time"] >= started
                ):
                    why = "of the candidates' user, orphaned, in no job's cgroup"
        if why:
            left.append(f"{info['pid']} {why}: {' '.join(info['cmdline'] or [])[:120]}")
    return left


def gpu_used_bytes() -> int | None:
    """Device memory in use on the GPU (every process), on a GPU sandbox; None on CPU."""
    if os.environ.get("DRTRITON_TEST_DEVICE", "cpu") != "cuda":
        return None
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


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


@contextlib.contextmanager
def watched_server(workers: int) -> Iterator[tuple[ServerProcess, Watcher]]:
    """A server of the test's own, watched while it runs; on leaving, it has stopped."""
    with running_server(workers=workers) as server:
        watcher = Watcher(server)
        try:
            yield server, watcher
        finally:
            watcher.stop()


# -- the test -------------------------------------------------------------------------------


def judge_all(target: str, jobs: list[dict]) -> tuple[list[VerifyResult], float]:
    """Every job, from CLIENTS clients at once; the answers and the seconds they took."""
    results: list[list[VerifyResult]] = [[] for _ in range(CLIENTS)]
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            with SandboxClient(target, timeout_s=300) as sandbox:
                results[k] = sandbox.verify_many(jobs[k::CLIENTS], concurrency=4)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test thread
            errors.append(err)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(3600)
    assert not errors, errors
    return [r for chunk in results for r in chunk], time.monotonic() - started


def check_answers(answers: list[VerifyResult], expected: dict[str, Sample]) -> None:
    """Each request answered once, with a verdict its class allows; none `sandbox_error`."""
    ids = Counter(r.request_id for r in answers)
    assert len(answers) == len(expected) and set(ids) == set(expected)
    assert max(ids.values()) == 1, "a request was answered twice"
    wrong = [
        (r.request_id, r.verdict, r.message[:200])
        for r in answers
        if r.verdict not in expected[r.request_id].verdicts
    ]
    summary = Counter((expected[rid].label, got) for rid, got, _ in wrong)
    assert not wrong, (
        f"{len(wrong)} of {len(answers)} misjudged {dict(summary)}; first: {wrong[:3]}"
    )


def check_nothing_left(
    server: ServerProcess,
    watcher: Watcher,
    started: float,
    gpu_before: int | None,
    roots: list[Path],
) -> None:
    """After the server stopped: no process, cgroup, job directory or GPU memory of it."""
    assert watcher.names, "no job directory was seen: nothing ran"
    assert not [r for r in roots if r.exists()], f"job roots left: {roots}"
    with contextlib.suppress(AssertionError):  # a killed process takes a moment to go
        wait_until(lambda: not leftover_processes(watcher, started), 30, "processes to end")
    left = leftover_processes(watcher, started)
    assert not left, left
    assert not job_cgroups(watcher.names), job_cgroups(watcher.names)
    if gpu_before is not None:
        wait_until(
            lambda: (gpu_used_bytes() or 0) <= gpu_before + GPU_SLACK_BYTES,
            60,
            "the GPU memory of the sandbox to be freed",
        )


@pytest.mark.parametrize(
    ("mix", "workers"),
    [(MIX, 2), pytest.param(FULL_MIX, 3, marks=pytest.mark.slow)],
    ids=["ci", "full"],
)
def test_many_clients_mixed_candidates(mix: dict[str, int], workers: int) -> None:
    """On a server of its own, which must end as it started and leave nothing behind."""
    jobs, expected = build_jobs(mix)
    assert len(jobs) == sum(mix.values()) >= 200
    gpu_before = gpu_used_bytes()
    started = time.time()
    with watched_server(workers) as (server, watcher):
        roots = runner_roots(server.pid)
        assert roots, "the server's job root was not found"
        with SandboxClient(server.target, timeout_s=300) as warm:
            assert warm.verify(RELU_PROBLEM, GOOD_RELU, timing=False).verdict == "correct"
            base_count, base_rss = settled_usage(server.pid)
            base_dirs = len(job_dirs(roots))  # the spares started ahead
            done_before = warm.info().jobs_done

            answers, elapsed = judge_all(server.target, jobs)
            check_answers(answers, expected)

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
        wait_until(
            lambda: len(job_dirs(roots)) <= base_dirs, 90, "finished jobs' directories to go"
        )
        jobs_seen = len(watcher.names)
    check_nothing_left(server, watcher, started, gpu_before, roots)
    print(
        f"{len(jobs)} jobs from {CLIENTS} clients on {workers} workers in {elapsed:.1f}s; "
        f"{jobs_seen} candidate processes; processes {base_count} -> {count}; "
        f"RSS {base_rss / 2**20:.0f} -> {rss / 2**20:.0f} MiB"
    )
