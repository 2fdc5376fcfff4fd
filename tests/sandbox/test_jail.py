"""The candidate's jail, judged from outside.

Each probe (`tests/sandbox/cases/escape/jail/`) runs inside a real jailed candidate process
forked by a real zygote, as the candidate's first action once every wall is up, with no
static gate and no in-process instrument in its way. What it tried is then checked on the
host: a file that must not appear, a listener that must not get a connection, a FIFO that
must stay empty, a process that must be gone once the job is, the candidate's credentials
as the host's /proc shows them. The probe's own report (`jail_probe.json`) says what it
saw and is checked too, but never alone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.isolation import (
    NOBODY,
    REPO_ROOT,
    TEST_FIRST_ACTION_ENV,
    Cgroup,
    Limits,
    cgroups_available,
    features,
    namespaces_available,
)
from sandbox.jail import cgroup as jail_cgroup
from sandbox.jail import rootfs
from sandbox.process import CandidateProcess, candidate_env
from sandbox.zygote import Zygote
from tests.sandbox.conftest import cpu_interpreter_problem

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="the jail needs root")

PROBES = Path(__file__).resolve().parent / "cases" / "escape" / "jail"
READY_S = 120.0
GONE_S = 30.0  # a generous deadline for a killed process to disappear (polled)
DEVICES = {"null", "zero", "full", "random", "urandom"}


@dataclass
class Jail:
    """A zygote whose forks run the probe in `probe_file` first; job directories in `jobs`."""

    zygote: Zygote
    probe_file: Path
    jobs: Path

    def start(
        self, probe: str | None, job_root: Path | None = None, limits: Limits | None = None,
        **fill: str,
    ) -> CandidateProcess:  # fmt: skip
        source = (PROBES / f"{probe}.py").read_text() if probe else ""
        for key, value in fill.items():
            placeholder = f"@@{key.upper()}@@"
            assert placeholder in source, f"{probe} has no {placeholder}"
            source = source.replace(placeholder, value)
        self.probe_file.write_text(source)
        return CandidateProcess(
            self.zygote, str(job_root or self.jobs), "cpu", limits or Limits(job_dir_mb=64)
        )


@pytest.fixture(scope="module")
def jail(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jail]:
    problem = cpu_interpreter_problem()
    if problem:
        pytest.skip(problem)
    root = tmp_path_factory.mktemp("jail")
    probe_file = root / "probe.py"
    probe_file.write_text("")
    home = root / "zygote"
    home.mkdir()
    env = {**candidate_env(str(home), "cpu"), TEST_FIRST_ACTION_ENV: str(probe_file)}
    zygote = Zygote("cpu", env)
    try:
        yield Jail(zygote, probe_file, root / "jobs")
    finally:
        zygote.close()


@contextlib.contextmanager
def started(
    jail: Jail, probe: str | None, job_root: Path | None = None, limits: Limits | None = None,
    **fill: str,
) -> Iterator[CandidateProcess]:  # fmt: skip
    proc = jail.start(probe, job_root, limits, **fill)
    try:
        yield proc
    finally:
        proc.close()


def report_of(proc: CandidateProcess) -> dict:
    path = Path(proc.job_dir, "jail_probe.json")
    assert path.exists(), f"the probe wrote no report; log: {proc.log_tail()}"
    return json.loads(path.read_text())


def candidate_pid(proc: CandidateProcess) -> int:
    """The host's pid of the candidate (its namespace's pid 1, the keeper's only child)."""
    keeper = proc.proc.pid
    children = Path(f"/proc/{keeper}/task/{keeper}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def host_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def alive_named(name: str) -> list[int]:
    """Live (not zombie) processes on the host whose comm is `name`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(f"/proc/{entry}/comm").read_text().strip() != name:
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                found.append(int(entry))
    return found


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


# -- identity ------------------------------------------------------------------------------


def test_the_candidate_runs_unprivileged_and_root_files_stay_out_of_reach(jail: Jail) -> None:
    with started(jail, "identity", secret="secret", locked="locked") as proc:
        job = Path(proc.job_dir)
        (job / "secret").write_text("root only")
        os.chmod(job / "secret", 0o600)
        (job / "locked").mkdir(mode=0o755)
        (job / "go").touch()
        proc.wait_ready(time.monotonic() + READY_S)
        status = host_status(candidate_pid(proc))
        report = report_of(proc)
        report_owner = (job / "jail_probe.json").stat().st_uid
        planted = (job / "locked" / "planted").exists()
    # Seen from the host: the candidate's credentials, and what it left.
    assert status["Uid"].split() == [str(NOBODY)] * 4, status["Uid"]
    assert status["Gid"].split() == [str(NOBODY)] * 4, status["Gid"]
    assert status["Groups"] == ""
    for caps in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"] == "1"
    assert report_owner == NOBODY
    assert not planted, "the candidate wrote into a root-owned directory"
    # And as the candidate saw it.
    assert report["secret"] == {"ok": False, "errno": errno.EACCES}
    assert report["setuid_back"] == {"ok": False, "errno": errno.EPERM}
    assert report["shadow"] == {"ok": False, "errno": errno.ENOENT}
    assert report["groups"] == []
    # /root holds only the way to the runtime bound under it, nothing of the host's own.
    runtime_under_root = {
        Path(p).relative_to("/root").parts[0]
        for p in rootfs.python_paths(REPO_ROOT)
        if Path(p).is_relative_to("/root")
    }
    listed = report["root_home"]
    assert not listed["ok"] or set(listed["value"]) <= runtime_under_root, listed
    assert set(report["root"]) <= {
        "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "root", "sbin",
        "tmp", "usr", *(Path(p).parts[1] for p in (REPO_ROOT, sys.prefix, sys.base_prefix)),
    }  # fmt: skip
    assert not {"home", "run", "var", "boot", "sys", "mnt", "opt", "srv"} & set(report["root"])


# -- host sockets, FIFOs, devices ------------------------------------------------------------


def test_no_host_socket_fifo_or_loopback_is_reachable(jail: Jail, tmp_path: Path) -> None:
    outside = tmp_path / "host"
    outside.mkdir()
    unix_path, fifo_path = outside / "listener.sock", outside / "pipe"
    abstract = f"drtriton-jail-{uuid.uuid4().hex}"
    listeners = []
    for family, address in (
        (socket.AF_UNIX, str(unix_path)),
        (socket.AF_UNIX, "\0" + abstract),
        (socket.AF_INET, ("127.0.0.1", 0)),
    ):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind(address)
        sock.listen(4)
        sock.setblocking(False)
        listeners.append(sock)
    os.chmod(outside, 0o777)
    os.chmod(unix_path, 0o777)
    os.mkfifo(fifo_path, 0o666)
    reader = os.open(fifo_path, os.O_RDONLY | os.O_NONBLOCK)  # a writer would get in at once
    port = listeners[2].getsockname()[1]
    try:
        with started(
            jail, "host_sockets", unix=str(unix_path), fifo=str(fifo_path), abstract=abstract,
            port=str(port),
        ) as proc:  # fmt: skip
            proc.wait_ready(time.monotonic() + READY_S)
            report = report_of(proc)
        for sock in listeners:
            with pytest.raises(BlockingIOError):
                sock.accept()
        try:
            written = os.read(reader, 100)  # b"": no writer ever came
        except BlockingIOError:
            written = b""  # a writer came but wrote nothing
        assert written == b""
    finally:
        os.close(reader)
        for sock in listeners:
            sock.close()
    assert report["unix"] == {"ok": False, "errno": errno.ENOENT}
    assert report["fifo"] == {"ok": False, "errno": errno.ENOENT}
    assert not report["abstract"]["ok"] and not report["tcp"]["ok"]
    assert not any(report["host_dirs"].values()), report["host_dirs"]
    assert set(report["dev"]) == DEVICES | {"shm", "fd", "stdin", "stdout", "stderr"}


# -- the system-call filter --------------------------------------------------------------------


def test_the_syscall_filter_refuses_what_the_kernel_would_otherwise_allow(jail: Jail) -> None:
    with started(jail, "syscalls") as proc:
        proc.wait_ready(time.monotonic() + READY_S)
        status = host_status(candidate_pid(proc))
        report = report_of(proc)
    assert status["Seccomp"] == "2", status.get("Seccomp")  # filtering, seen from the host
    refused = {
        # Each of these an unprivileged process may make on this kernel without the filter.
        "unshare_user": errno.EPERM,
        "clone_newuser": errno.EPERM,
        "ptrace_traceme": errno.EPERM,
        "keyctl": errno.EPERM,
        "io_uring_setup": errno.EPERM,
        "personality_no_aslr": errno.EPERM,
        "pdeathsig": errno.EPERM,
        "tiocsti": errno.EPERM,  # ENOTTY on /dev/null without the filter
        "inet": errno.EAFNOSUPPORT,
        "inet6": errno.EAFNOSUPPORT,
        "netlink": errno.EAFNOSUPPORT,
        # And these it may not make anyway; the filter answers first.
        "bpf": errno.EPERM,
        "perf_event_open": errno.EPERM,
        "userfaultfd": errno.EPERM,
        "kexec_load": errno.EPERM,
        "open_by_handle_at": errno.EPERM,
        "mount": errno.EPERM,
    }
    got = {name: (report[name]["result"], report[name]["errno"]) for name in refused}
    assert got == {name: (-1, code) for name, code in refused.items()}
    assert report["unix"] == {"result": 0, "errno": 0}  # the grader's pipe is a Unix socket
    assert report["fork"] == 7  # plain children still work


# -- nothing outlives the job ----------------------------------------------------------------


def test_nothing_the_candidate_started_outlives_the_job(jail: Jail) -> None:
    tag = uuid.uuid4().hex[:12]
    own, orphan = f"js{tag}", f"jo{tag}"
    try:
        with started(jail, "outlive", own=own, orphan=orphan) as proc:
            proc.wait_ready(time.monotonic() + READY_S)
            report = report_of(proc)
            # The probe did what it meant to: both are running, detached from the job.
            assert len(alive_named(own)) == 1 and len(alive_named(orphan)) == 1
            cgroup_dirs = list(proc.cgroup.dirs) if proc.cgroup else []
        # The job has ended (closed as the grader closes it): everything must be gone.
        wait_until(
            lambda: not alive_named(own) and not alive_named(orphan),
            GONE_S,
            "the job's processes to die",
        )
        assert not any(d.exists() for d in cgroup_dirs), "the job's cgroups were left behind"
    finally:
        for pid in alive_named(own) + alive_named(orphan):  # only this test's own processes
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    # The parent-death signal is the jail's: clearing it was refused.
    assert report["self_pdeathsig_errno"] == errno.EPERM
    assert report["orphan_pdeathsig_errno"] == errno.EPERM


_DETACHER = """
import os, sys, time
read_end, write_end = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write_end, str(os.getpid()).encode())
        time.sleep(1000)
    os._exit(0)
os.close(write_end)
print(os.read(read_end, 32).decode(), flush=True)
time.sleep(1000)
"""


def _kill_dirs(method: str, group: Cgroup, name: str) -> tuple[list[str], list[Path]]:
    """The cgroup directories `kill_all` is handed for `method`, and any made for it."""
    if method == "default":
        return [str(d) for d in group.dirs], []
    if method == "freezer":
        path = jail_cgroup.CGROUP_ROOT / "freezer" / jail_cgroup.GROUP / f"{name}-freezer"
        path.mkdir(parents=True)
        return [str(path)], [path]
    return [str(d) for d in group.dirs if "pids" in str(d)], []


@pytest.mark.parametrize("method", ["default", "freezer", "signals"])
def test_a_cgroup_kill_reaches_detached_descendants(method: str) -> None:
    """Without any namespace: a process tree that left its session dies through its cgroup."""
    if not cgroups_available():
        pytest.skip("no cgroups here")
    if method == "freezer" and not (jail_cgroup.CGROUP_ROOT / "freezer").is_dir():
        pytest.skip("no v1 freezer here")
    name = f"jail-test-{uuid.uuid4().hex[:8]}"
    group = Cgroup(name, memory_mb=256, processes=32)
    dirs, made = _kill_dirs(method, group, name)
    if not dirs:
        group.remove()
        pytest.skip(f"no cgroup for {method} here")

    def join() -> None:
        for path in dirs + [str(d) for d in group.dirs]:
            Path(path, "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen(
        [sys.executable, "-c", _DETACHER], stdout=subprocess.PIPE, text=True, preexec_fn=join
    )
    try:
        grandchild = int(proc.stdout.readline())
        assert grandchild in jail_cgroup.members(dirs)
        jail_cgroup.kill_all(dirs)
        proc.wait(timeout=GONE_S)
        wait_until(lambda: not jail_cgroup.members(dirs), GONE_S, "the cgroup to empty")
        assert not Path(f"/proc/{grandchild}").exists() or (
            Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        )
    finally:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()
        group.remove()


# -- private scratch, /dev, /proc ----------------------------------------------------------------


def test_scratch_space_dev_and_proc_are_the_jobs_own(jail: Jail) -> None:
    name = f"drtriton-jail-{uuid.uuid4().hex}"
    try:
        with started(jail, "scratch", name=name) as proc:
            proc.wait_ready(time.monotonic() + READY_S)
            report = report_of(proc)
        assert report["tmp"]["ok"] and report["shm"]["ok"]  # it wrote ... somewhere private
        assert not Path("/tmp", name).exists() and not Path("/dev/shm", name).exists()
    finally:
        for leftover in (Path("/tmp", name), Path("/dev/shm", name)):
            with contextlib.suppress(OSError):
                leftover.unlink()
    assert set(report["dev"]) == DEVICES | {"shm", "fd", "stdin", "stdout", "stderr"}
    assert report["null"] == {"ok": True}
    assert report["pids"] == [1]  # its own namespace: no host process to see
    assert not report["sysctl"]["ok"]
    for scratch in ("fill_tmp", "fill_shm"):  # size-limited: full long before the host is
        assert report[scratch]["errno"] == errno.ENOSPC, report[scratch]
        assert report[scratch]["bytes"] <= 256 << 20


# -- the job directory's quota -----------------------------------------------------------------


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this process's mount namespace."""
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info]
    return [p for p in points if p == str(path) or p.startswith(f"{path}/")]


def test_a_candidate_cannot_fill_more_than_its_job_directorys_quota(
    jail: Jail, tmp_path: Path
) -> None:
    """Each job directory is a size-limited tmpfs of its own (`sandbox.jail.quota`): the
    write that does not fit fails with ENOSPC, the host's file system keeps its room, the
    process serves on, and nothing is left on the host once the job is done."""
    job_root = tmp_path / "jobs"
    job_root.mkdir()
    with started(jail, "fill_job", job_root=job_root, limits=Limits(job_dir_mb=16)) as proc:
        assert proc.bounded and _mounts_under(job_root) == [proc.job_dir]
        ready = proc.wait_ready(time.monotonic() + READY_S)
        report = report_of(proc)
        cap = os.statvfs(proc.job_dir)
        # What it wrote is on the job's own file system, not the host's under it.
        assert os.stat(proc.job_dir).st_dev != os.stat(job_root).st_dev
        assert proc.request(time.monotonic() + 30, cmd="ping")["ok"]
        job_dir = Path(proc.job_dir)
    assert not any("job directory quota" in m for m in ready["jail_missing"])
    assert report["errno"] == errno.ENOSPC
    assert 8 << 20 <= report["bytes"] <= 16 << 20
    assert cap.f_blocks * cap.f_frsize == 16 << 20
    assert (cap.f_blocks - cap.f_bfree) * cap.f_frsize >= 8 << 20  # it was full there
    assert _mounts_under(job_root) == [] and not job_dir.exists()


# -- the isolation report ------------------------------------------------------------------------


def test_every_isolation_feature_holds_on_this_host(jail: Jail) -> None:
    """What the server reports at start-up (`sandbox.worker.probe_isolation`)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    outside = Path("/tmp", f"drtriton-probe-{uuid.uuid4().hex}")
    try:
        with started(jail, None) as proc:
            ready = proc.wait_ready(time.monotonic() + READY_S)
            reply = proc.request(
                time.monotonic() + 30, cmd="probe", port=listener.getsockname()[1],
                outside_path=str(outside),
            )  # fmt: skip
        try:
            listener.accept()
            connected = True
        except BlockingIOError:
            connected = False
        found = features(ready, reply, connected=connected, wrote_outside=outside.exists())
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            outside.unlink()
    names = {f["name"] for f in found}
    assert {
        "minimal_root",
        "private_dev",
        "no_privileges",
        "syscall_filter",
        "cgroup_kill",
    } <= names
    assert [f for f in found if not f["available"]] == []
    assert f"uid {NOBODY}" in next(f["detail"] for f in found if f["name"] == "no_privileges")


def test_a_process_that_never_jailed_is_reported_weak() -> None:
    """The report is no rubber stamp: a candidate that says it could not jail fails it."""
    ready = {"jail_missing": ["namespaces", "syscall filter (no libseccomp)"]}
    reply = {"uid": 0, "pid": 4242, "capabilities": True}
    weak = {
        f["name"]
        for f in features(ready, reply, connected=True, wrote_outside=True)
        if not f["available"]
    }
    assert {"pid_namespace", "network_namespace", "minimal_root", "no_privileges"} <= weak
    assert {"private_dev", "syscall_filter"} <= weak
