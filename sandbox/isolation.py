"""Process isolation for untrusted candidates: namespaces, read-only host, limits.

A candidate process is forked by a zygote (`sandbox.zygote`) into its own session,
a memory/pids cgroup where the host offers one, resource limits (CPU time, file
size, open files, address space on CPU), and fresh pid, network and mount
namespaces (`enter_namespaces`; the candidate is the init of its pid namespace,
so killing it kills every process it started, detached or not). Inside, before
anything else, `enter_jail` makes the whole file system read-only except the job
directory, drops to an unprivileged user, and caps processes.

Hosts without root or without these kernel features run candidates with fewer
walls; `probe` names what is missing, and the server refuses to start unless the
operator accepts weaker isolation explicitly.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
_MS_BIND = 4096
_SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64 share this number
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
CGROUP_V1_ROOT = Path("/sys/fs/cgroup")


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class Limits:
    """Resource limits of one candidate process."""

    cpu_s: int = 600
    file_mb: int = 64
    open_files: int = 256
    memory_mb: int = 8192
    processes: int = 512
    use_address_space_limit: bool = True  # CUDA reserves huge address space: off on GPU


@dataclass(frozen=True)
class Feature:
    name: str
    available: bool
    detail: str


_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000


def namespaces_available() -> bool:
    return os.geteuid() == 0


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_namespaces() -> None:
    """New mount and network namespaces now, a new pid namespace for the next child.

    Mounts become private (nothing propagates back to the host), as with
    `unshare --propagation private`.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID), "unshare")
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "private mounts")


def mount_proc() -> None:
    """In the first process of a new pid namespace: a /proc that shows only it."""
    libc = ctypes.CDLL(None, use_errno=True)
    _check(
        libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None),
        "mount /proc",
    )


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


def _set_readonly(libc: ctypes.CDLL, path: str, readonly: bool, recursive: bool) -> bool:
    attr = (
        _MountAttr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
        if readonly
        else _MountAttr(0, _MOUNT_ATTR_RDONLY, 0, 0)
    )
    flags = _AT_RECURSIVE if recursive else 0
    return (
        libc.syscall(
            _SYS_MOUNT_SETATTR,
            _AT_FDCWD,
            path.encode(),
            flags,
            ctypes.byref(attr),
            ctypes.sizeof(attr),
        )
        == 0
    )


def _bind(libc: ctypes.CDLL, source: str, target: str) -> bool:
    return libc.mount(source.encode(), target.encode(), None, _MS_BIND, None) == 0


# Kernel settings stay read-only although the candidate's own /proc is writable
# (the CUDA driver needs that).
_PROC_READONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")


def enter_jail(job_dir: str, processes: int, scratch_mb: int = 256) -> list[str]:
    """Inside the namespaces: read-only host except `job_dir`, then drop privileges.

    /tmp and /dev/shm become fresh private tmpfs mounts (what is written there
    vanishes with the job); the job directory is bound back in through an open
    descriptor. Returns the steps that could not be taken (empty when jailed).
    """
    if os.geteuid() != 0 or os.getpid() != 1:
        return ["namespaces"]
    missing: list[str] = []
    libc = ctypes.CDLL(None, use_errno=True)
    # Paths under /tmp or /dev/shm that must survive the fresh tmpfs mounts: the job
    # directory, and the interpreter, libraries and code when they live there.
    scratch_dirs = ("/tmp", "/dev/shm")
    keep = [job_dir] + [
        path
        for path in dict.fromkeys(str(Path(p).resolve()) for p in runtime_paths(full=True))
        if path.startswith(tuple(d + "/" for d in scratch_dirs)) and os.path.isdir(path)
    ]
    keep = [p for p in keep if not any(p.startswith(q + "/") for q in keep if q != p)]
    kept = [(path, os.open(path, os.O_PATH)) for path in keep]
    for scratch in scratch_dirs:
        if os.path.isdir(scratch) and (
            libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", 0, f"size={scratch_mb}m".encode()) != 0
        ):
            missing.append(f"private {scratch} (errno {ctypes.get_errno()})")
    for path, fd in kept:
        os.makedirs(path, exist_ok=True)
        if not _bind(libc, f"/proc/self/fd/{fd}", path):
            missing.append(f"bind {path} (errno {ctypes.get_errno()})")
        os.close(fd)
    if not _set_readonly(libc, "/", True, recursive=True):
        missing.append(f"read-only root (errno {ctypes.get_errno()})")
    for writable, recursive in (
        ("/proc", True),
        ("/tmp", False),
        ("/dev/shm", False),
        (job_dir, False),
    ):
        if os.path.isdir(writable):
            _set_readonly(libc, writable, False, recursive)
    for path in _PROC_READONLY:
        if os.path.exists(path) and _bind(libc, path, path):
            _set_readonly(libc, path, True, recursive=True)
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    if candidate_uid.__wrapped__() == NOBODY:  # decided afresh, inside the jail
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    elif not drop_capabilities(libc):
        missing.append("drop privileges")
    return missing


@functools.cache
def candidate_uid() -> int:
    """The user candidates run as: nobody where it can read the runtime, else ours.

    Decided once per process: it stats every directory above the runtime, and every file
    handed to a candidate asks (a few per candidate call when tensors go through files,
    one per file of the Triton cache each candidate starts from).
    """
    if os.geteuid() == 0 and readable_by_nobody(runtime_paths()):
        return NOBODY
    return os.geteuid()


def hand_over(path: str) -> None:
    """Give a file or directory to the candidate's user, private to it."""
    uid = candidate_uid()
    if uid != os.geteuid():
        os.chown(path, uid, uid)


def runtime_paths(full: bool = False) -> list[str]:
    """Files a candidate process must read: the interpreter, its libraries, this code.

    With `full`, directories (the environment's prefixes, the repository, every
    entry of sys.path) rather than representative files.
    """
    import sysconfig

    paths = {sys.executable, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
    paths.add(str(Path(__file__).resolve().parent))
    if full:
        paths = {sys.prefix, sys.base_prefix, sysconfig.get_paths()["purelib"]}
        paths.add(sysconfig.get_paths()["platlib"])
        paths.add(str(Path(__file__).resolve().parent.parent))
        paths.update(p for p in sys.path if p and os.path.isdir(p))
        paths.add(str(Path(sys.executable).parent))
    return sorted(paths)


def readable_by_nobody(paths: list[str]) -> bool:
    """Whether every ancestor is searchable and every path readable by others."""
    for path in paths:
        current = Path(path).resolve()
        if not current.exists():
            continue
        if not os.stat(current).st_mode & stat.S_IROTH:
            return False
        for parent in current.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
    return True


def drop_capabilities(libc: ctypes.CDLL) -> bool:
    """Stay uid 0 but without any capability, for good (no remount, no raw sockets)."""
    pr_set_no_new_privs, pr_capbset_drop = 38, 24
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        return False
    for cap in range(64):
        libc.prctl(pr_capbset_drop, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)
    data = (Data * 2)()
    return libc.capset(ctypes.byref(header), ctypes.byref(data)) == 0


class Cgroup:
    """A per-job cgroup (v1 memory+pids, or v2) capping memory and process count."""

    def __init__(self, name: str, memory_mb: int, processes: int) -> None:
        self.dirs: list[Path] = []
        v2 = CGROUP_V1_ROOT / "cgroup.controllers"
        if v2.exists():
            parent = CGROUP_V1_ROOT / "drtriton"
            parent.mkdir(exist_ok=True)
            (CGROUP_V1_ROOT / "cgroup.subtree_control").write_text("+memory +pids")
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
            path = parent / name
            path.mkdir()
            (path / "memory.max").write_text(str(memory_mb * 2**20))
            (path / "memory.swap.max").write_text("0")
            (path / "pids.max").write_text(str(processes))
            self.dirs.append(path)
            return
        memory = CGROUP_V1_ROOT / "memory" / "drtriton" / name
        memory.mkdir(parents=True)
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))
        self.dirs.append(memory)
        pids_root = CGROUP_V1_ROOT / "pids"
        if pids_root.is_dir():
            pids = pids_root / "drtriton" / name
            pids.mkdir(parents=True)
            (pids / "pids.max").write_text(str(processes))
            self.dirs.append(pids)

    def join(self) -> None:
        """Move the calling process in (a preexec hook: the child joins before exec)."""
        for path in self.dirs:
            (path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_killed(self) -> bool:
        for path in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                events = path / name
                if events.exists():
                    text = events.read_text()
                    for line in text.splitlines():
                        key, _, value = line.partition(" ")
                        if key in ("oom_kill", "oom") and value.strip() not in ("", "0"):
                            return True
            failcnt = path / "memory.failcnt"
            if failcnt.exists() and failcnt.read_text().strip() not in ("", "0"):
                return True
        return False

    def remove(self) -> None:
        for path in self.dirs:
            with contextlib.suppress(OSError):
                path.rmdir()


def cgroups_available() -> bool:
    if os.geteuid() != 0:
        return False
    if (CGROUP_V1_ROOT / "cgroup.controllers").exists():
        return "memory" in (CGROUP_V1_ROOT / "cgroup.controllers").read_text()
    return (CGROUP_V1_ROOT / "memory").is_dir() and os.access(CGROUP_V1_ROOT / "memory", os.W_OK)


def host_features() -> list[Feature]:
    """What this host offers, before the end-to-end probe of a real candidate process."""
    root = os.geteuid() == 0
    return [
        Feature("root", root, "needed for namespaces, cgroups and dropping privileges"),
        Feature("cgroups", cgroups_available(), "memory and process caps per job"),
    ]
