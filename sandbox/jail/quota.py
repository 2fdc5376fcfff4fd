"""A cap on a job directory's total size: the directory is a tmpfs of its own.

Files a candidate writes count against the job's tmpfs, not the host's /dev/shm or /tmp:
once it is full a write fails with ENOSPC (the harness answers `resource_limit`), and the
host's file systems keep their room. The grader mounts it when it makes the directory,
before anything is put there, and unmounts it when the job is done (`release`).
"""

from __future__ import annotations

import contextlib
import os

from sandbox.jail import syscalls as sc


def mount(job_dir: str, size_mb: int, uid: int) -> bool:
    """Make the empty directory `job_dir` a tmpfs of `size_mb`, owned by `uid`, mode 0700.

    Returns False (nothing changed) where this process may not mount.
    """
    if os.geteuid() != 0:
        return False
    options = f"size={size_mb}m,mode=0700,uid={uid},gid={uid}"
    try:
        sc.mount("tmpfs", job_dir, "tmpfs", sc.MS_NOSUID | sc.MS_NODEV, options)
    except OSError:
        return False
    return True


def resize(job_dir: str, size_mb: int) -> bool:
    """Change the job's cap (a job's own files are sized only once its problem is known:
    the grader's exchange files count against the same tmpfs). False if it is no tmpfs of
    ours or the new size cannot hold what is there."""
    if not os.path.ismount(job_dir):
        return False
    try:
        sc.mount(
            "tmpfs",
            job_dir,
            "tmpfs",
            sc.MS_REMOUNT | sc.MS_NOSUID | sc.MS_NODEV,
            f"size={size_mb}m",
        )
    except OSError:
        return False
    return True


def release(job_dir: str) -> None:
    """Detach the job's tmpfs (its files go with it); a directory that is not one stays."""
    with contextlib.suppress(OSError):
        if os.path.ismount(job_dir):
            sc.umount(job_dir, sc.MNT_DETACH)
