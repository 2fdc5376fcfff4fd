"""The candidate's identity: a dedicated unprivileged user, no capabilities, no new privileges.

The candidate runs as `CANDIDATE_UID` (nobody) with no supplementary groups. That needs
the runtime readable by others: in the minimal root (`sandbox.jail.rootfs`) the
directories above each bound path are the root's own (mode 0755), so only the bound trees
themselves count, not where they sit on the host (a Python under /root is fine, a
virtualenv made with umask 077 is not). Where they are not readable, the candidate stays
uid 0 with every capability dropped, and the isolation report says the identity is weak.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

from sandbox.jail import syscalls as sc

CANDIDATE_UID = 65534  # nobody
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LAST_CAP = 63


def _file_readable(path: Path, top: Path) -> bool:
    """`path` readable by others, and every directory from `top` down to it searchable."""
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        for parent in path.parents:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == top:
                break
    except OSError:
        return False
    return True


def runtime_readable(trees: list[str], files: list[str]) -> bool:
    """Whether others can list each bound tree and read each representative file in it."""
    roots = [Path(t).resolve() for t in trees]
    for tree in roots:
        mode = os.stat(tree).st_mode
        if mode & (stat.S_IROTH | stat.S_IXOTH) != stat.S_IROTH | stat.S_IXOTH:
            return False
    for name in files:
        path = Path(name).resolve()
        top = next((r for r in roots if path == r or r in path.parents), None)
        if top is None or not _file_readable(path, top):
            return False
    return True


def drop_to(uid: int) -> None:
    """Become `uid` for good: no groups, no capabilities (bounding and ambient sets too),
    no new privileges. Then SIGKILL on the parent's death again (a change of user clears it).
    """
    for cap in range(_LAST_CAP + 1):
        try:
            sc.prctl(sc.PR_CAPBSET_DROP, cap)
        except OSError:
            break  # past the kernel's last capability
    sc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise OSError(0, "the change of user did not hold")
    if capabilities_held():
        raise OSError(0, "capabilities survived the change of user")
    sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)


def drop_capabilities_as_root() -> None:
    """The weak fallback: stay uid 0 but without any capability, for good."""
    sc.prctl(sc.PR_SET_NO_NEW_PRIVS, 1)
    for cap in range(_LAST_CAP + 1):
        try:
            sc.prctl(sc.PR_CAPBSET_DROP, cap)
        except OSError:
            break
    sc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    sc.clear_capabilities()


def capabilities_held() -> bool:
    """Whether any capability is effective, permitted or ambient."""
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("CapEff", "CapPrm", "CapAmb") and int(value, 16):
                return True
    return False
