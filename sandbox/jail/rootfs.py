"""A fresh, minimal root for one candidate: only what Python, torch, Triton and the driver need.

The root is a new tmpfs. Into it go, at the same paths as on the host and read-only: /usr
(and the /bin, /lib, ... links to it), the Python runtime (the interpreter's prefix, the
environment's, every site directory), this package (not the rest of the repository), a
few /etc files (the loader's cache; passwd and group written here, naming root and the
candidate's user only). Fresh, private and size-limited: /tmp and /dev/shm. A /dev holding
only null, zero, full, random and urandom (and, on a GPU, the driver's nodes and the job's
GPU's own: `sandbox.jail.gpu_nodes`), a fresh /proc (the pid namespace's own; kernel
settings read-only), and the job directory (its own size-limited tmpfs where the grader
could mount one: `sandbox.jail.quota`), writable.
The directories on the way to a bound path are the tmpfs's own, mode 0755, so an
unprivileged user can reach the runtime even where it lives under /root; nothing else of
the host is there: no /root, /home, /run, /var, host /tmp, /etc/shadow, host sockets,
FIFOs or device nodes.

Built like bubblewrap builds its roots: a tmpfs is made the root with the host's root
below it (pivot_root), the new tree is assembled from the host's paths, then pivoted into
and the host's root detached. `plan_root` decides (pure, from host facts); `build_root`
performs it, as root, in a private mount namespace.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox.jail import syscalls as sc

# Paths that are never bound whole even if the runtime names them (the repository root,
# say, when it is on sys.path): their parts that are needed are bound instead.
NEVER_WHOLE = frozenset(
    {"/", "/root", "/home", "/etc", "/var", "/run", "/tmp", "/dev", "/proc", "/sys", "/boot"}
)
TOP_LEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FROM_HOST = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
)
DEVICE_NODES = ("null", "zero", "full", "random", "urandom")
# Kernel settings stay read-only in the candidate's /proc.
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus")
ROOT_TMPFS = "size=4m,mode=0755"
BASE = "/tmp"  # where the building tmpfs is mounted first (hidden again by the pivot)


@dataclass(frozen=True)
class Entry:
    """One thing in the new root, at `path` (the same path as on the host)."""

    path: str
    kind: str  # "bind", "tmpfs", "proc", "file", "symlink"
    source: str = ""  # bind: host path; symlink: its target; file: its text
    writable: bool = False
    executable: bool = True  # False: noexec
    devices: bool = False  # False: nodev
    recursive: bool = True  # bind: the mounts below the source come too
    options: str = ""  # tmpfs and proc mount data


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@functools.cache
def python_paths(repo_root: str) -> list[str]:
    """The directories the interpreter reads: prefixes, the standard library, site dirs.

    sys.path entries that hold the repository are left out (its `sandbox` package is
    bound on its own, `sandbox_package`): a candidate has no use for the rest of it.
    """
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths.update(v for k, v in sysconfig.get_paths().items() if k not in ("scripts", "data"))
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    paths.add(os.path.dirname(os.path.abspath(sys.executable)))
    paths.update(p for p in sys.path if p)
    return sorted(
        p
        for p in {os.path.abspath(p) for p in paths}
        if os.path.isdir(p) and not _inside(repo_root, p) and p not in NEVER_WHOLE
    )


def sandbox_package() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _env_paths(env: dict[str, str], repo_root: str) -> list[str]:
    """Directories the candidate's environment points the runtime at (PYTHONPATH, CUDA)."""
    found = []
    for name in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        found += [p for p in env.get(name, "").split(":") if p]
    if env.get("CUDA_HOME"):
        found.append(env["CUDA_HOME"])
    if env.get("TRITON_PTXAS_PATH"):
        found.append(os.path.dirname(env["TRITON_PTXAS_PATH"]))
    return [
        os.path.abspath(p)
        for p in found
        if os.path.isabs(p)
        and os.path.isdir(p)
        and not _inside(repo_root, p)
        and os.path.abspath(p) not in NEVER_WHOLE
    ]


def _runtime_binds(sources: list[str]) -> list[Entry]:
    """Read-only binds of `sources` at their real paths (symlinks resolved), none nested."""
    wanted = {os.path.realpath(path) for path in sources}
    chosen: list[str] = []
    for path in sorted(wanted, key=_depth):
        if path in NEVER_WHOLE or any(_inside(path, c) for c in chosen):
            continue
        if not os.path.isdir(path):
            continue
        chosen.append(path)
    return [Entry(p, "bind", source=p) for p in chosen]


def _passwd(uid: int) -> list[Entry]:
    """passwd and group naming only root and the candidate's user (getpwuid works)."""
    users = f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/:/usr/sbin/nologin\n"
    groups = f"root:x:0:\nsandbox:x:{uid}:\n"
    if uid == 0:
        users, groups = users.splitlines()[0] + "\n", groups.splitlines()[0] + "\n"
    return [
        Entry("/etc/passwd", "file", source=users),
        Entry("/etc/group", "file", source=groups),
        Entry("/etc/nsswitch.conf", "file", source="passwd: files\ngroup: files\nhosts: files\n"),
        Entry("/etc/hosts", "file", source="127.0.0.1 localhost\n::1 localhost\n"),
    ]


def _host_entry(path: str) -> Entry | None:
    """A host path as it is: a symlink copied, a file or directory bound read-only."""
    if os.path.islink(path):
        return Entry(path, "symlink", source=os.readlink(path))
    if os.path.exists(path):
        return Entry(path, "bind", source=path)
    return None


def _dev(device: str, nvidia: Sequence[str]) -> list[Entry]:
    nodes = [f"/dev/{name}" for name in DEVICE_NODES]
    if device == "cuda":
        nodes += nvidia
    # Writable while it is filled; `build_root` makes it read-only at the end.
    entries = [
        Entry("/dev", "tmpfs", writable=True, executable=False, options="size=64k,mode=0755")
    ]
    entries += [
        Entry(node, "bind", source=node, devices=True, executable=False)
        for node in nodes
        if os.path.exists(node)
    ]
    entries += [
        Entry("/dev/fd", "symlink", source="/proc/self/fd"),
        Entry("/dev/stdin", "symlink", source="/proc/self/fd/0"),
        Entry("/dev/stdout", "symlink", source="/proc/self/fd/1"),
        Entry("/dev/stderr", "symlink", source="/proc/self/fd/2"),
    ]
    return entries


def plan_root(
    job_dir: str,
    device: str,
    uid: int,
    scratch_mb: int,
    env: dict[str, str],
    repo_root: str,
    nvidia: Sequence[str] = (),
) -> list[Entry]:
    """What the candidate's root holds, parents before children; on a GPU, `nvidia` are the
    NVIDIA nodes its /dev gets (`sandbox.jail.gpu_nodes.for_env`)."""
    scratch = f"size={scratch_mb}m,mode=1777"
    entries = [
        Entry("/usr", "bind", source="/usr"),
        Entry("/tmp", "tmpfs", writable=True, options=scratch),
        # Writable for the process's own entries (the CUDA driver writes some); the kernel's
        # settings are bound read-only over it (PROC_READONLY).
        Entry("/proc", "proc", writable=True, executable=False, options="hidepid=invisible"),
        *_dev(device, nvidia),
        Entry("/dev/shm", "tmpfs", writable=True, options=scratch),
        *_passwd(uid),
    ]
    for path in (*TOP_LEVEL_LINKS, *ETC_FROM_HOST):
        entry = _host_entry(path)
        if entry is not None:
            entries.append(entry)
    if device == "cuda" and os.path.isdir("/sys"):
        # The driver reads the GPUs' PCI and NUMA facts there; the mounts below stay out.
        entries.append(Entry("/sys", "bind", source="/sys", recursive=False, executable=False))
    taken = [e.path for e in entries if e.kind == "bind"]
    runtime = python_paths(repo_root) + [sandbox_package()] + _env_paths(env, repo_root)
    entries += [e for e in _runtime_binds(runtime) if not any(_inside(e.path, t) for t in taken)]
    job = os.path.realpath(job_dir)
    entries.append(Entry(job, "bind", source=job, writable=True, recursive=False))
    return sorted(entries, key=lambda e: _depth(e.path))


# -- building ---------------------------------------------------------------------------------


def _make_dirs(path: str) -> None:
    """Create `path` and its missing parents, each mode 0755 whatever the umask."""
    missing = []
    current = Path(path)
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        os.mkdir(directory)
        os.chmod(directory, 0o755)


def _mount_flags(entry: Entry) -> tuple[int, int]:
    """(attributes to set, attributes to clear) for mount_setattr."""
    set_flags = sc.MOUNT_ATTR_NOSUID
    clear = 0
    set_flags |= 0 if entry.writable else sc.MOUNT_ATTR_RDONLY
    clear |= sc.MOUNT_ATTR_RDONLY if entry.writable else 0
    set_flags |= 0 if entry.devices else sc.MOUNT_ATTR_NODEV
    clear |= sc.MOUNT_ATTR_NODEV if entry.devices else 0
    set_flags |= 0 if entry.executable else sc.MOUNT_ATTR_NOEXEC
    clear |= sc.MOUNT_ATTR_NOEXEC if entry.executable else 0
    return set_flags, clear


def _place(entry: Entry, new_root: str, host_root: str) -> None:
    target = new_root + entry.path
    _make_dirs(os.path.dirname(target))
    if entry.kind == "symlink":
        os.symlink(entry.source, target)
        return
    if entry.kind == "file":
        with open(target, "w") as handle:
            handle.write(entry.source)
        os.chmod(target, 0o644)
        return
    if entry.kind == "bind":
        source = host_root + entry.source
        if os.path.isdir(source):
            _make_dirs(target)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        flags = sc.MS_BIND | (sc.MS_REC if entry.recursive else 0)
        sc.mount(source, target, None, flags)
    else:
        _make_dirs(target)
        noexec = 0 if entry.executable else sc.MS_NOEXEC
        fstype = "proc" if entry.kind == "proc" else "tmpfs"
        sc.mount(fstype, target, fstype, sc.MS_NOSUID | sc.MS_NODEV | noexec, entry.options)
    set_flags, clear = _mount_flags(entry)
    sc.set_mount_attributes(target, set_flags, clear, recursive=entry.recursive)
    if entry.kind == "proc":
        for name in PROC_READONLY:
            part = f"{target}/{name}"
            if os.path.exists(part):
                sc.mount(part, part, None, sc.MS_BIND | sc.MS_REC)
                sc.set_mount_attributes(
                    part, sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID, 0, recursive=True
                )


def build_root(entries: list[Entry]) -> None:
    """Make `entries` the whole file system of this process (and its mount namespace).

    Must run as root, in a mount namespace of its own whose mounts are private. Any
    failure leaves the process unusable: the caller must not run a candidate then.
    """
    sc.mount("tmpfs", BASE, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, "size=64k,mode=0755")
    os.mkdir(f"{BASE}/newroot")
    os.mkdir(f"{BASE}/oldroot")
    sc.pivot_root(BASE, f"{BASE}/oldroot")  # now "/" is that tmpfs, the host at /oldroot
    os.chdir("/")
    sc.mount("tmpfs", "/newroot", "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, ROOT_TMPFS)
    for entry in entries:
        _place(entry, "/newroot", "/oldroot")
    os.chdir("/newroot")
    sc.pivot_root(".", ".")  # the new tree on top, the building tmpfs (and host) under it
    sc.umount(".", sc.MNT_DETACH)  # ... and gone
    os.chdir("/")
    sc.set_mount_attributes("/", sc.MOUNT_ATTR_RDONLY | sc.MOUNT_ATTR_NOSUID, 0, False)
    if os.path.isdir("/dev"):
        sc.set_mount_attributes("/dev", sc.MOUNT_ATTR_RDONLY, 0, False)
