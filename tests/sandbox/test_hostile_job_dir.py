"""The job directory is the candidate's: the grader (root, unjailed) treats it as hostile.

Whatever a candidate puts in place of the grader's files (a symlink to a host file or to
the grader's own environment, a FIFO, a device node, a directory, a terabyte sparse file),
the grader neither writes, reads, changes nor waits on anything outside its own files, and
answers with a verdict on the kernel. The candidate's moves are made here by the test,
between the grader's commands (a static gate refuses candidates that try them, and these
tests are of the grader behind it); a canary outside the job directory, with a symlink to it
inside, shows that no host file changed or leaked.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sandbox import safe_fs
from sandbox.config import SandboxConfig
from sandbox.grader import Grader, Job
from sandbox.process import CandidateProcess
from sandbox.transfer import Exchange, ExchangeTampered
from tests.sandbox.conftest import GOOD_RELU, RELU_PROBLEM, WRONG_RELU, cpu_interpreter_problem

SECRET = "canary-4f1d9c: a host file the candidate must never see"


class Canary:
    """A host file outside the job directory, and everything about it that must not change."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "host-file"
        self.path.write_text(SECRET)
        self.path.chmod(0o640)
        self.before = self._state()

    def _state(self) -> tuple[Any, ...]:
        info = self.path.stat()
        return self.path.read_text(), stat.S_IMODE(info.st_mode), info.st_uid, info.st_size

    def assert_untouched(self) -> None:
        assert self._state() == self.before


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    outside = tmp_path / "outside"
    outside.mkdir()
    return Canary(outside)


def _plant(path: Path, kind: str, target: Path) -> None:
    """Put `kind` where `path` was (as a candidate may in its own directory)."""
    if kind == "sparse":  # the grader's own file, grown to a terabyte without writing it
        os.truncate(path, 1 << 40)
        return
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's node
    else:
        raise AssertionError(kind)


def _can_make_device_nodes(directory: Path) -> bool:
    try:
        os.mknod(directory / "probe-node", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        return False
    (directory / "probe-node").unlink()
    return True


# -- the primitives -------------------------------------------------------------------------


def test_a_new_file_is_never_one_already_there(tmp_path: Path, canary: Canary) -> None:
    dir_fd = safe_fs.open_dir(str(tmp_path))
    try:
        (tmp_path / "planted").symlink_to(canary.path)
        (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
        for name in ("planted", "dangling"):
            with pytest.raises(FileExistsError):
                safe_fs.write_new(dir_fd, name, b"overwritten")
        with pytest.raises(ValueError, match="plain file name"):
            safe_fs.create_file(dir_fd, "../escape")
    finally:
        os.close(dir_fd)
    canary.assert_untouched()
    assert not (tmp_path / "nowhere").exists()


def test_removing_a_job_directory_follows_no_symlink(tmp_path: Path, canary: Canary) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "to-file").symlink_to(canary.path)
    (job / "to-dir").symlink_to(canary.path.parent)
    os.mkfifo(job / "fifo")
    locked = job / "locked"
    locked.mkdir()
    (locked / "inside").write_text("x")
    locked.chmod(0)
    _deep_tree(job, 3000, canary.path.parent)  # deeper than recursion or descriptors allow
    try:
        assert safe_fs.remove_tree(str(job))
        assert not job.exists()
    finally:  # (pytest's own clean-up of tmp_path would fail on such a tree)
        safe_fs.remove_tree(str(job))
    canary.assert_untouched()
    assert sorted(p.name for p in canary.path.parent.iterdir()) == ["host-file"]


def _deep_tree(top: Path, depth: int, target: Path) -> None:
    """`depth` directories one inside the next (deeper than a path may name), a symlink to
    `target` at the bottom."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.symlink(target, "bottom", dir_fd=fd)
    os.close(fd)


def test_a_huge_sparse_log_is_read_by_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"start\n")
    os.truncate(log, 1 << 40)
    with open(log, "ab") as handle:
        handle.write(b"the end\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        started = time.monotonic()
        tail = safe_fs.read_tail(fd, 4000)
    finally:
        os.close(fd)
    assert len(tail) == 4000 and tail.endswith(b"the end\n")
    assert time.monotonic() - started < 5  # bounded: never the terabyte


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "missing"])
def test_exchange_files_are_read_through_the_graders_descriptor(
    tmp_path: Path, canary: Canary, kind: str
) -> None:
    job = tmp_path / "job"
    job.mkdir()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with Exchange(str(job), "cpu", shared=False) as exchange:
        (spec,) = exchange.put("in", [x], writable=False)
        (out,) = exchange.put("out", [x], writable=True)
        for path in (Path(spec["path"]), Path(out["path"])):
            if kind == "missing":
                path.unlink()
            else:
                _plant(path, kind, canary.path)
        started = time.monotonic()
        assert torch.equal(exchange.read(spec), x)  # what the grader wrote, not the canary
        assert torch.isnan(exchange.read(out)).all()
        assert time.monotonic() - started < 5  # a FIFO is never opened, so never waited on
        exchange.blanks([spec], "after")
    canary.assert_untouched()
    # The grader's names are gone; what the candidate put there is its own to leave.
    left = {p.name for p in job.iterdir()}
    assert all(kind != "symlink" or not Path(job, name).is_file() for name in left)


@pytest.mark.parametrize("change", ["grown", "cut"])
def test_an_exchange_file_cut_or_grown_is_tampering(tmp_path: Path, change: str) -> None:
    with Exchange(str(tmp_path), "cpu", shared=False) as exchange:
        (spec,) = exchange.put("out", [torch.ones(1000)], writable=True)
        os.truncate(spec["path"], 1 << 40 if change == "grown" else 10)
        started = time.monotonic()
        with pytest.raises(ExchangeTampered):
            exchange.read(spec)
        assert time.monotonic() - started < 5


# -- the grader, end to end -----------------------------------------------------------------


@pytest.fixture(scope="module")
def grader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grader]:
    problem = cpu_interpreter_problem()
    if problem:
        pytest.skip(problem)
    # The static gate set aside: these tests are of what stands behind it.
    root = str(tmp_path_factory.mktemp("jobs"))
    grader = Grader(SandboxConfig(device="cpu", job_root=root, static_gate=False), "cpu")
    yield grader
    grader.close()


def _job(candidate: str = GOOD_RELU) -> Job:
    return Job(problem=RELU_PROBLEM, candidate=candidate, timing=False, trials=2)


def _wait_removed(path: str) -> None:
    """The job directory goes with its candidate, in the background."""
    deadline = time.monotonic() + 60
    while os.path.lexists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.lexists(path), os.listdir(path)


KINDS = ["symlink", "fifo", "directory", "device", "sparse"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_graders_files_replaced_between_commands(
    grader: Grader,
    canary: Canary,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    kind: str,
) -> None:
    """After every reply, each of the grader's files in the job directory (tensors, the
    log) is replaced by `kind`: the grader judges what it handed over and nothing else."""
    if kind == "device" and not _can_make_device_nodes(tmp_path):
        pytest.skip("no device nodes can be made here")
    request = CandidateProcess.request
    job_dirs: list[str] = []

    def sabotaged(proc: CandidateProcess, *args: Any, **kwargs: Any) -> dict[str, Any]:
        reply = request(proc, *args, **kwargs)
        job_dirs.append(proc.job_dir)
        for path in list(Path(proc.job_dir).iterdir()):
            if path.suffix == ".bin" or path.name == "candidate.log":
                _plant(path, kind, canary.path)
        return reply

    monkeypatch.setattr(CandidateProcess, "request", sabotaged)
    started = time.monotonic()
    result = grader.grade(_job())
    assert time.monotonic() - started < 60
    if kind == "sparse":  # the grader's own file grown: the candidate changed it
        assert result.verdict == "tampering", result.message
    else:  # the names changed, the grader's files did not: the kernel is judged
        assert result.verdict == "correct", result.message
    assert SECRET not in result.candidate_log and SECRET not in result.message
    canary.assert_untouched()
    _wait_removed(job_dirs[0])


def test_a_log_pointed_at_the_graders_environment_leaks_nothing(
    grader: Grader, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = CandidateProcess.request

    def sabotaged(proc: CandidateProcess, *args: Any, **kwargs: Any) -> dict[str, Any]:
        reply = request(proc, *args, **kwargs)
        log = Path(proc.job_dir, "candidate.log")
        log.unlink(missing_ok=True)
        log.symlink_to("/proc/self/environ")
        return reply

    monkeypatch.setattr(CandidateProcess, "request", sabotaged)
    result = grader.grade(_job(WRONG_RELU))
    assert result.verdict == "wrong_output"  # a failed job reports its log
    assert "PATH=" not in result.candidate_log


# A candidate that rewrites its harness's replies (in its own process, all of it its own).
FORGER = (
    "import sandbox.candidate as harness\n"
    "_reply = harness.Harness.reply\n"
    "def reply(self, **payload):\n"
    "    if 'launches' not in payload:\n"
    "        return _reply(self, **payload)\n"
    "    {forge}\n"
    "harness.Harness.reply = reply\n"
) + GOOD_RELU

FORGERIES = {
    "deeply nested": 'self.conn.send_bytes(b\'{"seq": %d, "ok": true, "x": \' % self.seq'
    " + b'[' * 200000 + b']' * 200000 + b'}')",
    "wrong types": "_reply(self, **{**payload, 'launches': 'many'})",
    "lying list": "_reply(self, **{**payload, 'outputs': payload['outputs'] * 2})",
    "huge string": "_reply(self, **{**payload, 'outputs': [{'type': 'x' * 900000, 'written': 0}]})",
    "NaN number": "_reply(self, **{**payload, 'call_s': float('nan')})",
    "extra key": "_reply(self, **{**payload, 'verdict': 'correct'})",
    "oversized": "self.conn.send_bytes(b' ' * (2 << 20))",
    # Then alive and not reading, so that it is the flood the grader judges, not an exit.
    "launcher flood": '[self.conn.send_bytes(b\'{"build_launcher": ["*fp32"]}\') for _ in range(100)]'
    "\n    while True: pass",
    "half a message": "import os, struct; os.write(self.conn.fileno(), struct.pack('!i', 100) + b'{')",
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_malformed_reply_is_tampering_and_the_grader_goes_on(
    grader: Grader, forgery: str
) -> None:
    """The forger rewrites the harness's class, which the instruments now see before any
    reply leaves (`changed the sandbox's class`); should that check ever miss it, the
    grader's reading of replies rejects the forgery itself (its limits and schema are
    tested alone in test_replies.py). Either way: a rejection, and the worker goes on."""
    candidate = FORGER.replace("{forge}", FORGERIES[forgery])
    job = _job(candidate)
    if forgery == "half a message":
        job.budget_s = 5  # the rest never comes: the job's deadline ends the wait
    result = grader.grade(job)
    caught_first = "changed the sandbox's class sandbox.candidate.Harness"
    if caught_first not in result.message:
        expected = "timeout" if forgery == "half a message" else "tampering"
        assert result.verdict == expected, result.message
        why = {"launcher flood": "flooded the grader's pipe", "half a message": "time budget"}
        assert why.get(forgery, "sent a malformed reply") in result.message, result.message
    else:
        assert result.verdict == "tampering", result.message
    assert grader.grade(_job()).correct  # the worker is none the worse


SEGFAULT = GOOD_RELU.replace(
    "def triton_fused_operator(tensor_0):\n",
    "def triton_fused_operator(tensor_0):\n    import ctypes\n    ctypes.memset(16, 0, 64)\n",
)


def test_a_segfault_is_reported_at_once(grader: Grader) -> None:
    assert SEGFAULT != GOOD_RELU
    result = grader.grade(_job(SEGFAULT))
    assert result.verdict == "runtime_error" and "SIGSEGV" in result.message, result.message
    # From the moment its process was ready: not the seconds a wait for its exit cost.
    judged = result.elapsed_s - result.stage_seconds.get("start", 0.0)
    assert judged < 2.0, result.stage_seconds


def test_no_exit_status_is_read_for_a_process_still_running() -> None:
    from sandbox.process import exiting_status

    assert exiting_status(os.getpid()) is None
    assert exiting_status(2**22 + 7) is None  # no such process


# The same bytes written straight onto the harness's socket while the grader waits for the
# import's reply: no class of the sandbox's is touched, so they reach the grader's reader.
RAW_FORGER = (
    "import os, stat, struct\n"
    "def _pipe():\n"
    "    for name in sorted(os.listdir('/proc/self/fd'), key=int):\n"
    "        try:\n"
    "            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):\n"
    "                return int(name)\n"
    "        except OSError:\n"
    "            pass\n"
    "def _send(body):\n"
    "    os.write(_pipe(), struct.pack('!i', len(body)) + body)\n"
    "{forge}\n"
) + GOOD_RELU

RAW_FORGERIES = {
    "deeply nested": "_send(b'{\"seq\": 1, \"ok\": true, \"x\": ' + b'[' * 200000 + b']' * 200000 + b'}')",
    "oversized": "os.write(_pipe(), struct.pack('!i', 2 << 20) + b' ' * 4096)",
    "half a message": "os.write(_pipe(), struct.pack('!i', 100) + b'{')\nwhile True: pass",
    "launcher flood": '[_send(b\'{"build_launcher": ["*fp32"]}\') for _ in range(100)]\n'
    "while True: pass",
}


@pytest.mark.parametrize("forgery", list(RAW_FORGERIES))
def test_hostile_bytes_on_the_pipe_are_rejected_and_the_grader_goes_on(
    grader: Grader, forgery: str
) -> None:
    job = _job(RAW_FORGER.replace("{forge}", RAW_FORGERIES[forgery]))
    if forgery == "half a message":
        job.budget_s = 5  # the rest never comes: the job's deadline ends the wait
    result = grader.grade(job)
    expected = "timeout" if forgery == "half a message" else "tampering"
    assert result.verdict == expected, result.message
    why = {
        "launcher flood": "flooded the grader's pipe",
        "half a message": "time budget",
        "oversized": "more than",
    }
    assert why.get(forgery, "sent a malformed reply") in result.message, result.message
    assert grader.grade(_job()).correct  # the worker is none the worse
