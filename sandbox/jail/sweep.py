"""What sandboxes killed without their cleanup left behind, removed when a runner starts.

A runner (and its graders) killed with SIGKILL cannot unmount its jobs' tmpfs, remove its
job root or its jobs' cgroups. The next runner on the host sweeps them: job roots named
`runner-<pid>-*` whose process is gone (unmounted first, then removed), and `drtriton`
cgroups that hold no process and have not changed for an hour (a live runner's job keeps
its cgroup far shorter; an empty one is never in use for that long).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from sandbox import safe_fs
from sandbox.jail import quota
from sandbox.jail.cgroup import CGROUP_ROOT, GROUP

_RUNNER_DIR = re.compile(r"runner-(\d+)-[0-9a-f]+")
STALE_CGROUP_S = 3600.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_runner_roots(job_root: str) -> list[str]:
    """Job roots under `job_root` whose runner process no longer exists."""
    try:
        names = os.listdir(job_root)
    except OSError:
        return []
    found = []
    for name in names:
        match = _RUNNER_DIR.fullmatch(name)
        if match and not _alive(int(match.group(1))):
            found.append(os.path.join(job_root, name))
    return found


def stale_cgroups(root: Path = CGROUP_ROOT, now: float | None = None) -> list[Path]:
    """Empty job cgroups under every hierarchy's `drtriton` group, unchanged for an hour."""
    now = time.time() if now is None else now
    parents = [root / GROUP, *(p / GROUP for p in root.iterdir() if p.is_dir())]
    found = []
    for parent in parents:
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                if not child.is_dir():
                    continue
                with contextlib.suppress(OSError):
                    procs = (child / "cgroup.procs").read_text().split()
                    if not procs and now - child.stat().st_mtime > STALE_CGROUP_S:
                        found.append(child)
    return found


def sweep(job_root: str) -> int:
    """Remove what dead runners left; returns how many roots and cgroups went."""
    removed = 0
    for root in dead_runner_roots(job_root):
        quota.release_below(root)
        with contextlib.suppress(OSError):
            removed += bool(safe_fs.remove_tree(root))
    with contextlib.suppress(OSError):
        for group in stale_cgroups():
            with contextlib.suppress(OSError):
                group.rmdir()
                removed += 1
    return removed
