"""What a killed sandbox left behind is removed by the next runner, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandbox.jail import sweep


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_only_dead_runners_roots_are_swept(tmp_path: Path) -> None:
    dead = tmp_path / f"runner-{_dead_pid()}-abc123"
    live = tmp_path / f"runner-{os.getpid()}-def456"
    other = tmp_path / "not-a-runner"
    for root in (dead, live, other):
        (root / "job" / "sub").mkdir(parents=True)
        (root / "job" / "sub" / "file").write_text("x")
    assert sweep.dead_runner_roots(str(tmp_path)) == [str(dead)]
    assert sweep.sweep(str(tmp_path)) >= 1
    assert not dead.exists() and live.exists() and other.exists()


def test_only_empty_long_unchanged_cgroups_are_stale(tmp_path: Path) -> None:
    groups = {}
    for hierarchy, name, procs in [
        ("memory", "old-empty", ""),
        ("memory", "old-busy", "123\n"),
        ("pids", "new-empty", ""),
    ]:
        path = tmp_path / hierarchy / sweep.GROUP / name
        path.mkdir(parents=True)
        (path / "cgroup.procs").write_text(procs)
        groups[name] = path
    old = groups["old-empty"].stat().st_mtime
    now = old + sweep.STALE_CGROUP_S + 1
    os.utime(groups["new-empty"], (now, now))
    assert sweep.stale_cgroups(tmp_path, now=now) == [groups["old-empty"]]
