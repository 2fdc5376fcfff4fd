"""Files in a directory a candidate can write, handled by a privileged process.

The grader runs as root, outside the jail; a candidate's job directory is the candidate's.
Any name there may be a symlink to a host file, a FIFO that blocks whoever opens it, a
device node, a directory, or a sparse file of a terabyte. So the grader never opens a name
there by path: it opens relative to a descriptor of the directory, never follows a symlink,
never blocks on open, accepts only regular files, creates only names that did not exist
(`O_EXCL`), and thereafter reads and writes through its own descriptors (what the name
points to later does not matter). Every read is bounded. Ownership and modes change
through descriptors, never by name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from typing import Any

from sandbox.isolation import candidate_uid

# Every open of a name in a candidate's directory: no symlink followed (ELOOP), no wait on a
# FIFO or device, no terminal taken as the controlling one, nothing inherited by a child.
HOSTILE_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Removal of a job directory walks it this many times at most (each pass removes one level
# of every directory); a deeper tree is left (`remove_tree` says so).
MAX_REMOVE_PASSES = 1 << 16


def open_dir(path: str) -> int:
    """A descriptor of a directory the grader made (the path itself is not the candidate's)."""
    return os.open(path, DIR_OPEN)


def open_subdir(dir_fd: int, name: str) -> int:
    """A descriptor of the directory `name` in `dir_fd`, never through a symlink (the
    entry may be the candidate's to replace)."""
    _check_name(name)
    return os.open(name, DIR_OPEN, dir_fd=dir_fd)


def create_file(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new, empty regular file `name` in `dir_fd`, open for reading and writing.

    Fails (FileExistsError) if anything is there already, a dangling symlink included:
    the file written is always the one created here.
    """
    _check_name(name)
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | HOSTILE_OPEN, mode, dir_fd=dir_fd)


def unique_name(prefix: str, suffix: str = "") -> str:
    """A name no one can have made ahead of time."""
    return f"{prefix}{secrets.token_hex(6)}{suffix}"


def write_all(fd: int, data: memoryview | bytes, offset: int = 0) -> None:
    """All of `data` at `offset`, through the descriptor."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError("no progress writing a file")
        view, offset = view[written:], offset + written


def read_into(fd: int, buffer: memoryview, offset: int = 0) -> int:
    """Fill `buffer` from `offset`; the bytes read (fewer: the file ended)."""
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            break
        done += got
    return done


def read_tail(fd: int, limit: int) -> bytes:
    """At most the last `limit` bytes of a regular file, whatever its size (sparse too)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return b""
    start = max(0, info.st_size - limit)
    buffer = bytearray(min(limit, info.st_size))
    got = read_into(fd, memoryview(buffer), start)
    return bytes(buffer[:got])


def hand_over(fd: int) -> None:
    """Give the file behind `fd` to the candidate's user (`isolation.candidate_uid`)."""
    uid = candidate_uid()
    if uid != os.geteuid():
        os.fchown(fd, uid, uid)


def write_new(dir_fd: int, name: str, data: bytes) -> None:
    """A new file `name` holding `data`, handed over to the candidate's user."""
    fd = create_file(dir_fd, name)
    try:
        write_all(fd, data)
        hand_over(fd)
    finally:
        os.close(fd)


def unlink(dir_fd: int, name: str) -> None:
    """Remove the directory entry `name` (never what it points to), if it is a file's."""
    _check_name(name)
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
        os.unlink(name, dir_fd=dir_fd)


def remove_tree(path: str) -> bool:
    """Remove a candidate's directory and everything in it; whether it is gone.

    Symlinks are removed, never followed; no directory is opened by a path a candidate
    could change (each is opened by name relative to its parent, with O_NOFOLLOW). Deep
    trees cost neither recursion nor descriptors: each pass empties the top directory's
    subdirectories one level, moving their subdirectories up to the top. Only for a
    directory no process writes any more (its candidate is dead).
    """
    try:
        top = open_dir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        for _ in range(MAX_REMOVE_PASSES):
            if not _flatten_once(top):
                break  # empty, or nothing more can be removed
    finally:
        os.close(top)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _flatten_once(top: int) -> bool:
    """One pass of `remove_tree`: whether it removed or moved anything."""
    with os.scandir(top) as entries:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    progress = False
    for name, is_dir in names:
        if not is_dir:
            progress |= _try(os.unlink, name, dir_fd=top)
            continue
        try:
            sub = os.open(name, DIR_OPEN, dir_fd=top)
        except OSError:
            continue
        try:
            children: list[tuple[str, bool]] = []
            with contextlib.suppress(OSError), os.scandir(sub) as inner:
                children = [(e.name, e.is_dir(follow_symlinks=False)) for e in inner]
            for child, child_is_dir in children:
                if child_is_dir:  # up one level, under a fresh name
                    up = unique_name("up-")
                    progress |= _try(os.rename, child, up, src_dir_fd=sub, dst_dir_fd=top)
                else:
                    progress |= _try(os.unlink, child, dir_fd=sub)
        finally:
            os.close(sub)
        progress |= _try(os.rmdir, name, dir_fd=top)
    return progress


def _try(step: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether a removal step succeeded (a name that cannot go is left)."""
    try:
        step(*args, **kwargs)
    except OSError:
        return False
    return True


def _check_name(name: str) -> None:
    """A single name in the directory: never a path that leaves it."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ValueError(f"not a plain file name: {name!r}")
