"""Running one `drtriton` command as a child process: its output to a log file, its last
line to a status callback while it runs, and a clear error when it fails."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TAIL_BYTES = 4096


class StageFailed(RuntimeError):
    """A command of a stage exited with a status that is not one of its `ok` ones."""


def command_line(args: Sequence[str]) -> str:
    """The command as a person would type it."""
    return shlex.join(["drtriton", *args])


def last_line(path: Path) -> str:
    """The last non-empty line of a (growing) log file, progress-bar carriage returns split."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def failure_line(path: Path) -> str:
    """Why a command failed, in one line: its `drtriton: error:` line, else its last line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "no output"
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("drtriton") and "error" in line:
            return line
    return lines[-1] if lines else "no output"


def run_command(
    args: Sequence[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    on_output: Callable[[str], None] | None = None,
    ok: Sequence[int] = (0,),
    poll_s: float = 0.5,
) -> int:
    """Run `drtriton ARGS` from the repository root, appending its output to `log`.

    Returns its exit status when that is in `ok`, raises `StageFailed` (with the reason and
    the log's path) otherwise. Interrupted, the child is stopped before the interrupt goes on.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        handle.write(f"$ {command_line(args)}\n")
        handle.flush()
        proc = subprocess.Popen(
            [sys.executable, "-m", "drtriton_cli", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            while proc.poll() is None:
                if on_output is not None:
                    on_output(last_line(log))
                time.sleep(poll_s)
        except BaseException:
            _stop(proc)
            raise
    status = proc.returncode
    if status not in ok:
        raise StageFailed(
            f"`{command_line(args[:2])} ...` exited with status {status}: {failure_line(log)} "
            f"(log, with the whole command: {log})"
        )
    return status


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
