"""Process isolation for untrusted candidates: the jail's walls, in the order they go up.

A candidate process is forked by a zygote (`sandbox.zygote`) into its own session, the
job's cgroup (memory and process caps, and a kill that reaches all it starts:
`sandbox.jail.cgroup`), resource limits (CPU time, file size, open files, address space
on CPU), and fresh pid, network, mount, IPC, UTS and cgroup namespaces
(`enter_namespaces`; the candidate is the init of its pid namespace, so its death ends
every process it started). Its job directory is a size-limited tmpfs the grader mounted
(`sandbox.jail.quota`). Inside, before anything else, `enter_jail` makes a minimal
root its whole file system (`sandbox.jail.rootfs`: the runtime read-only, private /dev
with only its own GPU's nodes (`sandbox.jail.gpu_nodes`), /proc, /tmp and /dev/shm, the
job directory) and drops to an unprivileged user (`sandbox.jail.identity`); once the
harness has set itself up, `lock_down` loads the system-call filter
(`sandbox.jail.seccomp`), just before any candidate code runs.

Hosts without root or without these kernel features run candidates with fewer walls;
`features` names what holds, and the server refuses to start unless the operator
accepts weaker isolation explicitly.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import resource
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.jail import gpu_nodes, identity, quota, rootfs, seccomp
from sandbox.jail import syscalls as sc
from sandbox.jail.cgroup import CGROUP_ROOT, Cgroup, cgroups_available, kill_method

__all__ = [
    "CGROUP_ROOT",
    "JOB_TMP_DIR",
    "NOBODY",
    "Cgroup",
    "Feature",
    "Limits",
    "apply_limits",
    "candidate_uid",
    "cgroups_available",
    "enter_jail",
    "enter_namespaces",
    "features",
    "hand_over",
    "lock_down",
    "mount_proc",
    "namespaces_available",
    "prepare",
]

NOBODY = identity.CANDIDATE_UID
REPO_ROOT = str(Path(__file__).resolve().parent.parent)
SCRATCH_MB = 256  # each of the candidate's private /tmp and /dev/shm
# The candidate's TMPDIR, in its job directory: Triton's compile writes its temporary files
# there, and nothing of the grader's ever lives there (`guard_hatches.add_audit_hook`).
JOB_TMP_DIR = "tmp"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one candidate process."""

    cpu_s: int = 600
    file_mb: int = 64
    open_files: int = 256
    memory_mb: int = 8192
    processes: int = 512
    job_dir_mb: int = 1024  # its job directory's cap (sandbox.jail.quota), beyond the grader's
    use_address_space_limit: bool = True  # CUDA reserves huge address space: off on GPU


@dataclass(frozen=True)
class Feature:
    name: str
    available: bool
    detail: str


_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000


def namespaces_available() -> bool:
    return os.geteuid() == 0


def enter_namespaces() -> None:
    """New mount, network, IPC, UTS and cgroup namespaces now, a new pid namespace for the
    next child. Mounts become private (nothing propagates back to the host).

    Call after joining the job's cgroups: the cgroup namespace is rooted where it starts.
    """
    sc.unshare(
        _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
        | _CLONE_NEWCGROUP
    )  # fmt: skip
    sc.mount("none", "/", None, sc.MS_REC | sc.MS_PRIVATE)


def mount_proc() -> None:
    """In the first process of a new pid namespace: a /proc that shows only it."""
    sc.mount("proc", "/proc", "proc", sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC)


def apply_limits(limits: Limits) -> None:
    """Set rlimits on the calling process (a preexec hook, before exec)."""
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    size = limits.file_mb * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.use_address_space_limit:
        mem = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def _pids_cgroup() -> bool:
    """Whether this host caps processes per job by cgroup (`Cgroup` makes one wherever so)."""
    v2 = CGROUP_ROOT / "cgroup.controllers"
    return (CGROUP_ROOT / "pids").is_dir() or (v2.exists() and "pids" in v2.read_text())


def enter_jail(
    job_dir: str, processes: int, scratch_mb: int = SCRATCH_MB, device: str = "cpu"
) -> list[str]:
    """Inside the namespaces, as their pid 1: the minimal root, then an unprivileged user.

    Returns the walls that could not be raised (empty when fully jailed). A root that
    cannot be built raises: the process must not serve a candidate then.
    """
    missing = []
    if not quota.bounded(job_dir):  # seen before the root hides the host's mounts
        missing.append("job directory quota (it is no size-limited tmpfs of its own)")
    if os.geteuid() != 0 or os.getpid() != 1:
        return ["namespaces", *missing]
    uid = candidate_uid()  # as the grader decides it (the zygote decided it before forking)
    if not _pids_cgroup():
        # Counted per user across the host: a cap shared by every job's candidates, so
        # only where no per-job pids cgroup caps them.
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    nvidia, why = gpu_nodes.for_env(os.environ) if device == "cuda" else ([], "")
    if why:
        missing.append(f"GPU device nodes (every GPU's node is bound: {why})")
    entries = rootfs.plan_root(
        job_dir, device, uid, scratch_mb, dict(os.environ), REPO_ROOT, nvidia=nvidia
    )
    rootfs.build_root(entries)
    os.chdir(job_dir)
    if uid == 0:
        identity.drop_capabilities_as_root()
        return [*missing, "unprivileged user (the Python runtime is not readable by others)"]
    identity.drop_to(uid)
    return missing


def prepare() -> None:
    """In the zygote, before it forks: what every jail decides alike, decided once (the
    candidate's user, the runtime's paths, the GPU's nodes; about 7 ms a fork otherwise)."""
    candidate_uid()
    rootfs.python_paths(REPO_ROOT)
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "" and os.path.exists("/dev/nvidiactl"):
        gpu_nodes.for_env(os.environ)  # the zygote's environment is its candidates'


def lock_down() -> list[str]:
    """The last wall, once the harness is set up and before candidate code: the syscall
    filter (with no_new_privs, which it needs; also where the rest of the jail is missing).
    """
    try:
        sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)
        missing = seccomp.apply()
    except OSError as err:
        missing = [f"syscall filter ({err})"]
    if _first_action is not None:
        _run_first_action(_first_action)
    return missing


# Tests only: Python source that a zygote started with this variable in its environment
# reads from the file it names, at each fork, and runs in the jailed process as the
# candidate's first action, once every wall is up and before the harness says ready (the
# in-process instruments are not armed then: only the jail stands in its way). No request
# reaches it: a grader starts its zygote with `candidate_env`, a fixed set of variables.
TEST_FIRST_ACTION_ENV = "DRTRITON_TEST_JAIL_PROBE"
_first_action: str | None = None


def set_first_action(source: str) -> None:
    global _first_action
    _first_action = source


def _run_first_action(source: str) -> None:
    import traceback

    try:
        exec(compile(source, "<jail probe>", "exec"), {"__name__": "__jail_probe__"})  # noqa: S102
    except BaseException:  # noqa: BLE001 - the probe's failure is in the log, the process serves
        traceback.print_exc()


def _runtime_trees() -> tuple[list[str], list[str]]:
    """The runtime's bound trees and a file of each kind the candidate must read."""
    trees = rootfs.python_paths(REPO_ROOT) + [rootfs.sandbox_package()]
    files = [
        os.path.realpath(sys.executable),
        os.path.join(sysconfig.get_paths()["stdlib"], "os.py"),
        os.path.join(rootfs.sandbox_package(), "candidate.py"),
    ]
    for package in ("torch", "triton"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin:
            files.append(spec.origin)
    return trees, files


@functools.cache
def candidate_uid() -> int:
    """The user candidates run as: nobody where it can read the runtime, else ours.

    Decided once per process (every file handed to a candidate asks). The jail and the
    grader decide alike: the same runtime, the same test (`identity.runtime_readable`).
    """
    if os.geteuid() == 0 and identity.runtime_readable(*_runtime_trees()):
        return NOBODY
    return os.geteuid()


def hand_over(path: str) -> None:
    """Give a file or directory to the candidate's user, private to it."""
    uid = candidate_uid()
    if uid != os.geteuid():
        os.chown(path, uid, uid)


def features(
    ready: dict[str, Any], reply: dict[str, Any], *, connected: bool, wrote_outside: bool
) -> list[dict[str, Any]]:
    """Which walls hold, from a fresh candidate process's `ready` and `probe` replies (no
    candidate code has run in it) and what the host saw (a connection, a file)."""
    missing: list[str] = list(ready.get("jail_missing", []))
    jailed = "namespaces" not in missing and reply.get("pid") == 1
    uid = reply.get("uid")

    def lacks(prefix: str) -> str:
        return next((m for m in missing if m.startswith(prefix)), "")

    def feature(name: str, available: bool, detail: str) -> dict[str, Any]:
        return {"name": name, "available": bool(available), "detail": detail}

    method = kill_method()
    return [
        feature(
            "pid_namespace",
            reply.get("pid") == 1,
            "candidate is init of its own pid namespace; killing it kills all it started",
        ),
        feature("network_namespace", not connected, "no network, not even loopback"),
        feature(
            "minimal_root",
            jailed and not wrote_outside,
            "a fresh root: the runtime read-only, private /tmp, /proc and /dev/shm, "
            "the job directory; nothing else of the host",
        ),
        feature(
            "private_dev",
            jailed and not lacks("GPU device nodes"),
            lacks("GPU device nodes")
            or "/dev holds null, zero, full, random, urandom (and the job's GPU's nodes: "
            "nvidiactl, nvidia-uvm, its own nvidiaN) only",
        ),
        feature(
            "job_dir_quota",
            not lacks("job directory quota"),
            lacks("job directory quota")
            or "the job directory is a size-limited tmpfs of its own (sandbox.jail.quota): "
            "the candidate fills its allowance, not a host disk; the grader's files come on "
            "top, allocated ahead",
        ),
        feature(
            "no_privileges",
            jailed and uid not in (None, 0) and not reply.get("capabilities", True),
            f"candidate runs as uid {uid} with no capabilities"
            + (f" ({lacks('unprivileged user')})" if lacks("unprivileged user") else ""),
        ),
        feature(
            "syscall_filter",
            not lacks("syscall filter"),
            lacks("syscall filter") or "seccomp: a table of denied calls (sandbox.jail.seccomp)",
        ),
        feature(
            "cgroup_kill",
            cgroups_available() and bool(method),
            f"every process of a job killed through its cgroup ({method or 'no way here'})",
        ),
        feature("memory_cgroup", cgroups_available(), "per-job memory and process caps"),
        feature("rlimits", True, "CPU time, file size, open files (and address space on CPU)"),
    ]


def host_features() -> list[Feature]:
    """What this host offers, before the end-to-end probe of a real candidate process."""
    root = os.geteuid() == 0
    return [
        Feature("root", root, "needed for namespaces, cgroups and dropping privileges"),
        Feature("cgroups", cgroups_available(), "memory and process caps per job"),
    ]
