"""Thin ctypes wrappers over the mount and process system calls the jail needs.

Each raises OSError with the call's errno; nothing here decides policy.
"""

from __future__ import annotations

import ctypes
import os

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
# x86_64 and aarch64 share these numbers (the newer calls are numbered alike everywhere).
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SYS_MOUNT_SETATTR = 442

PR_SET_PDEATHSIG = 1
PR_GET_NO_NEW_PRIVS = 39
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: unknown machine {os.uname().machine}")
    _check(_libc.syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


def set_mount_attributes(path: str, set_flags: int, clear_flags: int, recursive: bool) -> None:
    """mount_setattr(2): flags of the mount at `path` (and those below it, if recursive)."""
    attr = _MountAttr(set_flags, clear_flags, 0, 0)
    _check(
        _libc.syscall(
            _SYS_MOUNT_SETATTR,
            _AT_FDCWD,
            path.encode(),
            _AT_RECURSIVE if recursive else 0,
            ctypes.byref(attr),
            ctypes.sizeof(attr),
        ),
        f"mount_setattr {path}",
    )


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def prctl(option: int, arg: int = 0) -> int:
    result = _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl {option}: {os.strerror(err)}")
    return result


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def clear_capabilities() -> None:
    """capset(2) with every set empty (effective, permitted, inheritable)."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
