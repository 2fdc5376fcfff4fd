"""Run a test worker module on a forced 8-device CPU mesh, in its own process.

JAX fixes its device count when it starts, so mesh tests run their worker as a module in a
subprocess and read the JSON report it prints last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_on_eight_devices(module: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    """`python -m module args...` on 8 CPU devices; its last stdout line as JSON."""
    env = {
        **os.environ,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
