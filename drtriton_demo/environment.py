"""What the demo needs of the machine: the installed parts, and a GPU or not.

Checked before anything runs, so a missing library is one line rather than a traceback ten
minutes in. Modules are looked up, not imported (a lookup costs nothing).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

# Module -> the distribution that brings it (what to install).
REQUIRED = {
    "torch": "torch",
    "triton": "triton",
    "ortools": "ortools",
    "grpc": "grpcio",
    "grpc_health": "grpcio-health-checking",
    "jax": "jax",
    "flax": "flax",
    "optax": "optax",
    "orbax.checkpoint": "orbax-checkpoint",
    "grain": "grain",
    "tokenizers": "tokenizers",
    "matplotlib": "matplotlib",
    "rich": "rich",
}
INSTALL_HINT = "run `make install` (or pip install -e '.[sandbox,synth,learner]')"


class EnvironmentProblem(RuntimeError):
    """The machine cannot run the demo; the message is one line that says why and what to do."""


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken install
        return False


def missing_packages(required: dict[str, str] | None = None) -> list[str]:
    """Distributions whose module cannot be found, in `REQUIRED` order."""
    table = REQUIRED if required is None else required
    return list(dict.fromkeys(dist for module, dist in table.items() if not _present(module)))


def check_packages() -> None:
    missing = missing_packages()
    if missing:
        raise EnvironmentProblem(f"the demo needs {', '.join(missing)}: {INSTALL_HINT}")


def gpu_present() -> bool:
    """Whether `nvidia-smi -L` lists a GPU (the test `make install` uses)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def resolve_device(requested: str) -> str:
    """ "cpu" or "cuda" for --device auto|cpu|cuda; asking for cuda without a GPU is refused."""
    if requested == "cpu":
        return "cpu"
    has_gpu = gpu_present()
    if requested == "cuda" and not has_gpu:
        raise EnvironmentProblem("--device cuda, but nvidia-smi lists no GPU on this machine")
    return "cuda" if has_gpu else "cpu"


def stage_environment(device: str) -> dict[str, str]:
    """The environment of every stage's process: on a GPU, JAX leaves room for the
    sandbox's torch processes on the same card (unless the caller already chose)."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cuda":
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    return env
