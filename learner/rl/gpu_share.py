"""The learner's part in the sandbox host's GPU gate, when both share one GPU.

A timed loop with someone else's kernels on the GPU measures their work too, so a wrong
speedup becomes a wrong reward. The sandbox's graders already take `sandbox.gpu_gate`
(a `flock` reader-writer lock on files under the job root): correctness work holds it
shared, each timed loop exclusive, with writer preference. The learner joins as one more
reader: it holds a shared hold around each of its GPU phases (sampling, the update,
evaluation), waiting for the results inside the hold, so no timed loop runs while the
learner computes, and no learner phase starts while a timed loop waits or runs.
Correctness trials may still run beside the learner: they are not timed.

`rl.gpu_gate_dir`: "" = off (CPU, or a sandbox on other GPUs); a directory = that gate;
"auto" = the gate of the local sandbox server this process started (its runner's job
root, found through the server's process id). `sandbox.gpu_gate` imports only the
standard library: the learner stays free of torch and triton.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from collections.abc import Iterator
from pathlib import Path

from learner.train.config import ConfigError


class GpuShare:
    """Shared holds on one gate directory; counts the time spent waiting for them."""

    def __init__(self, directory: str) -> None:
        from sandbox.gpu_gate import GpuGate

        self.directory = directory
        self._gate = GpuGate(directory)
        self.waited_s = 0.0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        started = time.perf_counter()
        with self._gate.shared():
            self.waited_s += time.perf_counter() - started
            yield


class NoShare:
    """No gate: the learner has its GPU (or CPU) to itself."""

    directory = ""
    waited_s = 0.0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        yield


def _child_pids() -> list[int]:
    """Process ids of this process's children (Linux /proc)."""
    me, children = os.getpid(), []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(me):
            children.append(int(Path(stat).parent.name))
    return children


def local_gate_dir(job_root: str | None = None) -> str:
    """The job root of the sandbox server this process started (its GPU gate directory).

    With one GPU the runner's root holds the gate; with several, each GPU has its own
    (`gpu-<i>`), and the learner must name the one it shares explicitly.
    """
    from sandbox.config import default_job_root

    root = job_root or default_job_root()
    found = [d for pid in _child_pids() for d in glob.glob(os.path.join(root, f"runner-{pid}-*"))]
    if len(found) != 1:
        raise ConfigError(
            f"rl.gpu_gate_dir=auto: found {len(found)} job roots of local sandbox servers under "
            f"{root}; set rl.gpu_gate_dir to the sandbox's job root"
        )
    if glob.glob(os.path.join(found[0], "gpu-*")):
        raise ConfigError(
            f"rl.gpu_gate_dir=auto: the local sandbox spans several GPUs ({found[0]}/gpu-*); "
            "set rl.gpu_gate_dir to the one this learner uses"
        )
    return found[0]


def open_share(setting: str) -> GpuShare | NoShare:
    """The gate for `rl.gpu_gate_dir` (see the module docstring)."""
    if not setting:
        return NoShare()
    return GpuShare(local_gate_dir() if setting == "auto" else setting)
