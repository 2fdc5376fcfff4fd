"""A per-job cgroup: memory and process caps, and a kill that reaches every process of the job.

Processes of a job cannot leave its cgroup (they have no capability, and no cgroup file
system in their root), so killing the cgroup kills whatever they started: detached,
double-forked, in a new session, with its parent-death signal cleared. The kill is
atomic where the kernel offers it: cgroup v2's `cgroup.kill` (a pure v2 host, or the v2
hierarchy of a hybrid one, which needs no controller for it); else the v1 freezer
(freeze, SIGKILL every member, thaw: nothing forks in between); else SIGKILL to every
member, round after round.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "drtriton"
FREEZE_WAIT_S = 2.0
_KILL_ROUNDS = 50


def _is_v2(root: Path) -> bool:
    return (root / "cgroup.controllers").exists()


def _hybrid_v2_root() -> Path | None:
    """The v2 hierarchy of a host whose controllers are on v1 (systemd's 'unified')."""
    unified = CGROUP_ROOT / "unified"
    return unified if _is_v2(unified) else None


class Cgroup:
    """A per-job cgroup (v1 memory+pids+kill, or v2) capping memory and process count."""

    def __init__(self, name: str, memory_mb: int, processes: int) -> None:
        self.dirs: list[Path] = []
        if _is_v2(CGROUP_ROOT):
            parent = CGROUP_ROOT / GROUP
            parent.mkdir(exist_ok=True)
            (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids")
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
            path = parent / name
            path.mkdir()
            self.dirs.append(path)
            (path / "memory.max").write_text(str(memory_mb * 2**20))
            (path / "memory.swap.max").write_text("0")
            (path / "pids.max").write_text(str(processes))
            return
        try:
            self._make_v1(name, memory_mb, processes)
        except OSError:
            self.remove()
            raise

    def _make_v1(self, name: str, memory_mb: int, processes: int) -> None:
        memory = CGROUP_ROOT / "memory" / GROUP / name
        memory.mkdir(parents=True)
        self.dirs.append(memory)
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb * 2**20))
        pids_root = CGROUP_ROOT / "pids"
        if pids_root.is_dir():
            pids = pids_root / GROUP / name
            pids.mkdir(parents=True)
            self.dirs.append(pids)
            (pids / "pids.max").write_text(str(processes))
        killer = self._kill_dir(name)
        if killer is not None:
            self.dirs.append(killer)

    @staticmethod
    def _kill_dir(name: str) -> Path | None:
        """A cgroup to kill the job through on a v1 host: in its v2 hierarchy, or the freezer."""
        unified = _hybrid_v2_root()
        if unified is not None:
            path = unified / GROUP / name
            path.mkdir(parents=True)
            if (path / "cgroup.kill").exists():
                return path
            path.rmdir()
        freezer = CGROUP_ROOT / "freezer"
        if freezer.is_dir():
            path = freezer / GROUP / name
            path.mkdir(parents=True)
            return path
        return None

    def join(self) -> None:
        """Move the calling process in (a preexec hook: the child joins before exec)."""
        for path in self.dirs:
            (path / "cgroup.procs").write_text(str(os.getpid()))

    def kill(self) -> None:
        kill_all([str(p) for p in self.dirs])

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


def members(dirs: list[str]) -> set[int]:
    """Every process in any of `dirs`."""
    pids: set[int] = set()
    for path in dirs:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(p) for p in Path(path, "cgroup.procs").read_text().split())
    return pids


def _signal_all(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _freeze_and_kill(freezer: Path) -> None:
    state = freezer / "freezer.state"
    state.write_text("FROZEN")
    deadline = time.monotonic() + FREEZE_WAIT_S
    while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        _signal_all(members([str(freezer)]))
    finally:
        state.write_text("THAWED")  # the kills land as they thaw


def kill_all(dirs: list[str]) -> None:
    """SIGKILL every process of the job's cgroups (see the module's docstring); returns once
    the signals are sent, not when the processes are gone."""
    paths = [Path(d) for d in dirs]
    with contextlib.suppress(OSError):
        killer = next((p for p in paths if (p / "cgroup.kill").exists()), None)
        if killer is not None:
            (killer / "cgroup.kill").write_text("1")
            return
        freezer = next((p for p in paths if (p / "freezer.state").exists()), None)
        if freezer is not None:
            _freeze_and_kill(freezer)
            return
    for _ in range(_KILL_ROUNDS):  # anything left, or no atomic way on this host
        pids = members(dirs)
        if not pids:
            return
        _signal_all(pids)
        time.sleep(0.001)


def kill_method() -> str:
    """How `kill_all` reaches a job's processes on this host ('' when only by signals)."""
    if _is_v2(CGROUP_ROOT) or _hybrid_v2_root() is not None:
        return "cgroup.kill"
    if (CGROUP_ROOT / "freezer").is_dir():
        return "freezer"
    return ""


def cgroups_available() -> bool:
    if os.geteuid() != 0:
        return False
    if _is_v2(CGROUP_ROOT):
        return "memory" in (CGROUP_ROOT / "cgroup.controllers").read_text()
    return (CGROUP_ROOT / "memory").is_dir() and os.access(CGROUP_ROOT / "memory", os.W_OK)
