"""The host-wide GPU gate: readers share, a timed loop is alone, a waiting writer goes first.

Each holder is a process of its own (`Actors`) that notes in an append-only log when it
has the gate and when it lets go. The tests wait on states they can observe, never on
time: a line in the log, or a process blocked in `flock` (the kernel lists the holders
and waiters of every lock in /proc/locks). The order of the log's lines is the order in
which the holds began and ended, whatever the machine's load.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import sandbox.gpu_gate
from sandbox.gpu_gate import GpuGate, SharedHold

CONTEXT = multiprocessing.get_context("spawn")  # the test process may run threads (JAX)
# How long a state may take to come before the test fails: only a broken gate (or a
# machine stalled for minutes) runs into it; a passing test never waits it out.
STATE_TIMEOUT_S = 120.0

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks to see who waits"
)


def _note(log_path: str, **event: Any) -> None:
    """Append one event: a single O_APPEND write, so lines from processes never mix."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(event) + "\n").encode())
    finally:
        os.close(fd)


def _act(directory: str, name: str, kind: str, quiet_within: float, log: str, go: Any) -> None:
    """Hold the gate as `kind` (`shared`, `exclusive`, or `overrun`: a shared hold given
    up as a call past its lease), note `in` with what the hold reports, wait for `go`
    (None: let go at once), note `out`, let go."""
    gate = GpuGate(directory)
    held = gate.exclusive(quiet_within) if kind == "exclusive" else gate.shared()
    with held as hold:
        if kind == "overrun":
            hold.overrun()
        report = {k: getattr(hold, k, None) for k in ("waited_s", "overrun_wait_s", "quiet")}
        _note(log, name=name, event="in", **report)
        if go is not None:  # a pipe: a byte, or the test's end closing it
            go.poll(STATE_TIMEOUT_S * 5)
        _note(log, name=name, event="out")


def _flocks() -> list[tuple[bool, str, int, int]]:
    """Every flock on the host: (waiting, READ or WRITE, pid, inode)."""
    found = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        waiting = len(fields) > 1 and fields[1] == "->"
        if waiting:
            del fields[1]
        if len(fields) >= 6 and fields[1] == "FLOCK":
            found.append((waiting, fields[3], int(fields[4]), int(fields[5].rsplit(":", 1)[1])))
    return found


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll an observable state until it holds (STATE_TIMEOUT_S: the gate is broken)."""
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


class Actors:
    """Processes that take the gate in `directory` and log what they did (see `_act`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = str(directory)
        self.gate = GpuGate(self.directory)
        self.log = str(directory / "events.jsonl")
        self.procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self.go: dict[str, Any] = {}

    def start(self, name: str, kind: str, hold: bool = False, quiet_within: float = 0.0) -> None:
        """Start `name`; with `hold` it keeps the gate until `release(name)`."""
        # A pipe, not an Event: setting an Event that a killed process waited on hangs.
        go, send_go = CONTEXT.Pipe(duplex=False) if hold else (None, None)
        proc = CONTEXT.Process(
            target=_act, args=(self.directory, name, kind, quiet_within, self.log, go)
        )
        proc.start()
        self.procs[name] = proc
        if go is not None:
            go.close()
            self.go[name] = send_go

    def release(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self.go[name].send_bytes(b"go")

    def events(self) -> list[tuple[str, str]]:
        """(name, `in` or `out`) in the order they happened."""
        return [(e["name"], e["event"]) for e in self._records()]

    def report(self, name: str) -> dict[str, Any]:
        """What `name`'s hold reported when it began."""
        return next(e for e in self._records() if e["name"] == name and e["event"] == "in")

    def _records(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.log):
            return []
        return [json.loads(line) for line in Path(self.log).read_text().splitlines()]

    def happened(self, name: str, event: str = "in") -> bool:
        return (name, event) in self.events()

    def wait_in(self, *names: str) -> None:
        for name in names:
            wait_for(lambda n=name: self.happened(n), f"{name} to take the gate")

    def blocked(self, name: str) -> bool:
        """Whether `name` is waiting in flock on one of the gate's files."""
        pid = self.procs[name].pid
        inodes = self.inodes()
        return any(w and p == pid and i in inodes for w, _, p, i in _flocks())

    def holds_gate_alone(self, name: str) -> bool:
        """Whether `name` holds the gate itself exclusively (and waits on no lock)."""
        pid = self.procs[name].pid
        gate = os.stat(self.gate.gate_path).st_ino
        locks = [(w, mode, i) for w, mode, p, i in _flocks() if p == pid]
        return (False, "WRITE", gate) in locks and not any(w for w, _, _ in locks)

    def inodes(self) -> set[int]:
        """The inodes of the gate's lock files."""
        paths = (self.gate.writers_path, self.gate.gate_path, self.gate.overrun_path)
        return {os.stat(p).st_ino for p in paths if os.path.exists(p)}

    def join(self, *names: str) -> None:
        for name in names or tuple(self.procs):
            self.procs[name].join(STATE_TIMEOUT_S)
            assert self.procs[name].exitcode == 0, f"{name} ended with {self.procs[name].exitcode}"

    def close(self) -> None:
        for go in self.go.values():
            go.close()  # the end of the pipe: every holder lets go
        for proc in self.procs.values():
            proc.join(STATE_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()


@pytest.fixture
def actors(tmp_path: Path) -> Iterator[Actors]:
    team = Actors(tmp_path)
    try:
        yield team
    finally:
        team.close()


def test_readers_share_the_gate(actors: Actors) -> None:
    actors.start("first", "shared", hold=True)
    actors.wait_in("first")
    actors.start("second", "shared")
    wait_for(lambda: actors.happened("second", "out"), "the second reader to come and go")
    assert actors.events() == [("first", "in"), ("second", "in"), ("second", "out")]
    actors.release("first")
    actors.join()


def test_a_timed_loop_waits_for_readers_and_readers_wait_for_it(actors: Actors) -> None:
    actors.start("reader", "shared", hold=True)
    actors.wait_in("reader")
    actors.start("writer", "exclusive")
    wait_for(lambda: actors.blocked("writer"), "the writer to wait")
    assert not actors.happened("writer")
    actors.release("reader")
    actors.join("reader", "writer")
    assert actors.events() == [
        ("reader", "in"),
        ("reader", "out"),
        ("writer", "in"),
        ("writer", "out"),
    ]
    assert actors.report("writer")["waited_s"] > 0

    actors.start("timed", "exclusive", hold=True)
    actors.wait_in("timed")
    actors.start("late reader", "shared")
    wait_for(lambda: actors.blocked("late reader"), "the reader to wait")
    assert not actors.happened("late reader")
    actors.release("timed")
    actors.join()
    assert actors.events()[-4:] == [
        ("timed", "in"),
        ("timed", "out"),
        ("late reader", "in"),
        ("late reader", "out"),
    ]
    assert actors.report("late reader")["waited_s"] > 0


def _queue_behind_a_reader(actors: Actors, arrivals: tuple[tuple[str, str], ...]) -> None:
    """A reader holds the gate while `arrivals` (name, kind) come one after another, each
    once the one before waits (or, a reader the gate lets pass, has been in); then the
    first reader goes and everyone ends."""
    actors.start("first reader", "shared", hold=True)
    actors.wait_in("first reader")
    for name, kind in arrivals:
        actors.start(name, kind)
        wait_for(
            lambda n=name: actors.blocked(n) or actors.happened(n),
            f"{name} to wait for the first reader (or pass it)",
        )
    actors.release("first reader")
    actors.join()


def test_a_waiting_writer_blocks_new_readers(actors: Actors) -> None:
    """Writer preference: a stream of readers cannot starve a timed loop."""
    _queue_behind_a_reader(actors, (("writer", "exclusive"), ("new reader", "shared")))
    assert actors.events() == [
        ("first reader", "in"),
        ("first reader", "out"),
        ("writer", "in"),
        ("writer", "out"),
        ("new reader", "in"),
        ("new reader", "out"),
    ]


def test_waiting_writers_go_one_after_another_before_new_readers(actors: Actors) -> None:
    """Timed loops that wait together share one drain of the readers: no reader that came
    while they waited slips in between them (each would make the next drain again), even
    one that came before some of them."""
    writers, readers = ("a", "b", "c"), ("r1", "r2")
    arrivals = (("a", "exclusive"), ("r1", "shared"), ("b", "exclusive"))
    _queue_behind_a_reader(actors, (*arrivals, ("r2", "shared"), ("c", "exclusive")))
    events = actors.events()
    assert events[:2] == [("first reader", "in"), ("first reader", "out")]
    by_writers = events[2 : 2 + 2 * len(writers)]
    assert sorted(name for name, _ in by_writers) == sorted(writers * 2)
    for k in range(0, len(by_writers), 2):  # one writer at a time
        assert by_writers[k][1] == "in" and by_writers[k + 1] == (by_writers[k][0], "out")
    after = events[2 + 2 * len(writers) :]  # every new reader after every writer
    assert sorted(after) == sorted((name, e) for name in readers for e in ("in", "out"))


def test_a_released_hold_lets_a_timed_loop_in_before_the_block_ends(actors: Actors) -> None:
    with actors.gate.shared() as hold:
        actors.start("writer", "exclusive")
        wait_for(lambda: actors.blocked("writer"), "the writer to wait for this reader")
        assert not actors.happened("writer")
        hold.release()
        assert not hold.held
        actors.wait_in("writer")  # still inside the block
    actors.join()


def test_a_dead_holder_does_not_wedge_the_gate(actors: Actors) -> None:
    actors.start("holder", "exclusive", hold=True)
    actors.wait_in("holder")
    pid = actors.procs["holder"].pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    actors.procs["holder"].join()
    actors.start("next", "exclusive")
    actors.wait_in("next")
    actors.join("next")


def test_a_timed_loop_waits_for_calls_running_past_their_lease(actors: Actors) -> None:
    """An overrunning call gives the gate up but still runs on the GPU: timing waits."""
    actors.start("overrun", "overrun", hold=True)
    actors.wait_in("overrun")
    actors.start("timed", "exclusive", quiet_within=STATE_TIMEOUT_S)
    # The gate itself was free: the timed loop has it, and waits for the overrun alone.
    wait_for(lambda: actors.holds_gate_alone("timed"), "the timed loop to take the gate")
    assert not actors.happened("timed")
    actors.release("overrun")
    actors.join()
    assert actors.events() == [
        ("overrun", "in"),
        ("overrun", "out"),
        ("timed", "in"),
        ("timed", "out"),
    ]
    report = actors.report("timed")
    assert report["quiet"] and report["overrun_wait_s"] > 0


def test_the_wait_for_overruns_is_bounded_and_readers_pass(
    actors: Actors, monkeypatch: pytest.MonkeyPatch
) -> None:
    actors.start("overrun", "overrun", hold=True)
    actors.wait_in("overrun")
    actors.start("reader", "shared")  # correctness work is not held up by an overrun
    wait_for(lambda: actors.happened("reader", "out"), "the reader to pass")
    with actors.gate.exclusive(quiet_within=0.3) as timed:  # the overrun is still on
        assert not timed.quiet
        assert timed.overrun_wait_s >= 0.3
    sleeps: list[float] = []
    fake_time = SimpleNamespace(monotonic=time.monotonic, sleep=sleeps.append)
    monkeypatch.setattr(sandbox.gpu_gate, "time", fake_time)
    with actors.gate.exclusive() as untimed:  # no bound given: looked at once, no wait
        assert not untimed.quiet
    assert sleeps == []
    monkeypatch.undo()
    actors.procs["overrun"].terminate()
    actors.procs["overrun"].join()
    with actors.gate.exclusive(quiet_within=STATE_TIMEOUT_S) as after:
        assert after.quiet  # a dead holder's mark goes with it


def _overrun_marked(gate: GpuGate) -> bool:
    """Whether some call past its lease marks the GPU busy (its shared lock is held)."""
    with open(gate.overrun_path, "ab") as overrun:
        try:
            fcntl.flock(overrun, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(overrun, fcntl.LOCK_UN)
        return False


@pytest.mark.usefixtures("cpu_candidates")
def test_a_graders_call_past_its_lease_marks_the_gpu_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grader's lease hands the gate over as an overrun, for as long as the call runs.

    Looked at from the hold's own steps (not by sampling): marked when the gate is given
    up, still marked when the call ends, unmarked after."""
    import sandbox.grader
    import sandbox.grading.trials
    from sandbox.config import SandboxConfig
    from sandbox.grader import Grader, Job
    from tests.sandbox.conftest import GOOD_RELU, RELU_PROBLEM

    monkeypatch.setattr(sandbox.grading.trials, "SHARED_LEASE_S", 0.05)
    monkeypatch.setattr(sandbox.grader, "static_verdict", lambda *a, **k: None)  # time.sleep
    slow = GOOD_RELU.replace(  # each call outlasts its lease (the reply cannot come sooner)
        "def triton_fused_operator(tensor_0):\n",
        "def triton_fused_operator(tensor_0):\n    import time\n    time.sleep(0.4)\n",
    )
    gate = GpuGate(str(tmp_path / "gate"))
    seen: list[str] = []
    overrun, end = SharedHold.overrun, SharedHold.end

    def watched_overrun(hold: SharedHold) -> None:
        overrun(hold)
        seen.append("overrun, marked" if _overrun_marked(gate) else "overrun, unmarked")

    def watched_end(hold: SharedHold) -> None:
        if hold._overrun is not None:
            seen.append("end, marked" if _overrun_marked(gate) else "end, unmarked")
            end(hold)
            seen.append("after, marked" if _overrun_marked(gate) else "after, unmarked")
        else:
            end(hold)

    monkeypatch.setattr(SharedHold, "overrun", watched_overrun)
    monkeypatch.setattr(SharedHold, "end", watched_end)
    grader = Grader(SandboxConfig(device="cpu", job_root=str(tmp_path)), "cpu")
    grader.gate = gate
    try:
        result = grader.grade(Job(problem=RELU_PROBLEM, candidate=slow, timing=False, trials=2))
    finally:
        grader.close()
    assert result.correct, result.message
    assert seen and seen == ["overrun, marked", "end, marked", "after, unmarked"] * (len(seen) // 3)


def test_the_workers_self_test_waits_for_a_timed_loop(actors: Actors) -> None:
    """The device self-test runs kernels: it takes a share, never runs beside a timed loop."""
    from sandbox.worker import held_self_test

    actors.start("timed", "exclusive", hold=True)
    actors.wait_in("timed")
    answers: list[str] = []
    test = threading.Thread(target=lambda: answers.append(held_self_test(actors.gate, "cpu")))
    test.start()
    own_pid, inodes = os.getpid(), actors.inodes()
    wait_for(
        lambda: any(w and p == own_pid and i in inodes for w, _, p, i in _flocks()),
        "the self-test to wait for the timed loop",
    )
    assert not answers
    actors.release("timed")
    test.join(STATE_TIMEOUT_S)
    assert answers == [""]
    assert held_self_test(None, "cpu") == ""  # without a gate (a CPU grader): at once
