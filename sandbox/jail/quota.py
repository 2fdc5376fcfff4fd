"""A cap on a job directory's total size, kept by the kernel: the directory is a tmpfs of its own.

The grader mounts it (`mount`) when it makes the directory, before anything is put there,
sized to the candidate's allowance (`Limits.job_dir_mb`, and `FILES` names). Whatever the
candidate writes there counts against it: past the cap a write fails with ENOSPC in the
candidate's own process (the harness answers `resource_limit`), and the host's disks and
its shared /dev/shm keep their room. The tmpfs is in memory (its pages are charged to
the memory cgroup of whoever wrote them) and goes when the job does (`release`): nothing
of the job is left on any host file system.

The grader's own files there (a command's tensors, `sandbox.transfer`) come on top of the
allowance, sized from the job's known I/O one file at a time: before making a file the
grader grows the cap by its size (`grow`), then allocates all of it (`allocate`), so no
later write of its own, nor the harness's through a mapping, can fail for want of room;
when the file goes the room is given back (`give_back`). The kernel keeps what is used
within the cap at every moment, so the allocation right after the cap grew fails only if
something else took the new room in between: the candidate, writing between commands
(`sandbox.transfer.JobDirectoryFull`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from dataclasses import dataclass

from sandbox.jail import syscalls as sc

FILES = 1 << 16  # names (inodes) a candidate may make in its job directory
# Inodes the cap grows by for each file of the grader's: a file may take more than one
# unit of tmpfs's inode space (its security labels, say).
INODES_PER_FILE = 4


@dataclass(frozen=True)
class Room:
    """How much a cap grew for one of the grader's files (nothing where there is no cap)."""

    bytes: int = 0
    files: int = 0


NO_ROOM = Room()


def mount(job_dir: str, size_mb: int, uid: int, files: int = FILES) -> bool:
    """Make the empty directory `job_dir` a tmpfs of `size_mb` and `files` names, owned by
    `uid`, mode 0700. Returns False (nothing changed) where this process may not mount."""
    if os.geteuid() != 0:
        return False
    options = f"size={size_mb}m,nr_inodes={files},mode=0700,uid={uid},gid={uid}"
    try:
        sc.mount("tmpfs", job_dir, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, options)
    except OSError:
        return False
    return True


def bounded(job_dir: str) -> bool:
    """Whether `job_dir` is a mount of its own (only `mount` makes job directories so)."""
    return os.path.ismount(job_dir)


def _cap(job_dir: str) -> tuple[int, int, int]:
    """(bytes, inodes, page size) of the tmpfs at `job_dir`."""
    info = os.statvfs(job_dir)
    return info.f_blocks * info.f_frsize, info.f_files, info.f_frsize


def _set_cap(job_dir: str, size: int, inodes: int) -> None:
    sc.mount(
        "tmpfs",
        job_dir,
        "tmpfs",
        sc.MS_REMOUNT | sc.MS_NOSUID | sc.MS_NODEV,
        f"size={size},nr_inodes={inodes}",
    )


def grow(job_dir: str, nbytes: int, files: int = 1) -> Room:
    """Widen the job's cap by `nbytes` (in whole pages) and `files` names, for a file of the
    grader's about to be made; the room added (NO_ROOM where `job_dir` has no cap, or it
    could not grow)."""
    if not bounded(job_dir):
        return NO_ROOM
    try:
        size, inodes, page = _cap(job_dir)
        room = Room(-(-nbytes // page) * page, files * INODES_PER_FILE)
        _set_cap(job_dir, size + room.bytes, inodes + room.files)
    except OSError:
        return NO_ROOM
    return room


def give_back(job_dir: str, room: Room) -> None:
    """Narrow the cap by `room` once the grader's file is gone. Left as it is when what the
    directory holds would not fit (a mapping of the file, still alive, keeps its pages): the
    cap stays as wide as the allowance plus the grader's files either way."""
    if room == NO_ROOM or not bounded(job_dir):
        return
    with contextlib.suppress(OSError):
        size, inodes, _ = _cap(job_dir)
        _set_cap(job_dir, max(size - room.bytes, 0), max(inodes - room.files, 1))


def allocate(fd: int, nbytes: int) -> None:
    """All of the file's `nbytes` allocated now (and its size set), so no write into it
    fails later for want of room; OSError (ENOSPC) if they do not fit."""
    if nbytes <= 0:
        return
    while True:
        try:
            os.posix_fallocate(fd, 0, nbytes)
            return
        except InterruptedError:
            continue


def is_full(error: OSError) -> bool:
    """Whether `error` says a file system (or its names) ran out."""
    return error.errno in (errno.ENOSPC, errno.EDQUOT)


def release(job_dir: str) -> None:
    """Detach the job's tmpfs (its files go with it, once nothing holds them open); a
    directory that is not one stays as it is."""
    with contextlib.suppress(OSError):
        if bounded(job_dir):
            sc.umount(job_dir, sc.MNT_DETACH)


def mounts_below(root: str, mountinfo: str) -> list[str]:
    """The tmpfs mount points strictly below `root` in a /proc/<pid>/mountinfo text,
    deepest first."""
    prefix = os.path.abspath(root).rstrip("/") + "/"
    found = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or tail.split()[:1] != ["tmpfs"]:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
        if point.startswith(prefix):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def release_below(root: str) -> None:
    """Detach every job tmpfs left under `root` (a grader that died with jobs in flight
    leaves theirs mounted); before the directories themselves are removed."""
    try:
        with open("/proc/self/mountinfo") as info:
            points = mounts_below(root, info.read())
    except OSError:
        return
    for point in points:
        with contextlib.suppress(OSError):
            sc.umount(point, sc.MNT_DETACH)
