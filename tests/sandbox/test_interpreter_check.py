"""A CPU sandbox runs only where Triton's interpreter works, and says why not elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sandbox.process import candidate_env
from sandbox.zygote import Zygote, ZygoteError
from tests.sandbox.cases.manifest import CASES_DIR
from tests.sandbox.conftest import REPO_ROOT, cpu_interpreter_problem

_NUMPY_WITHOUT_SCALAR_ARRAYS = tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4)


def _fault_dir(tmp_path: Path) -> Path:
    """A directory whose sitecustomize makes the interpreter check fail, as NumPy 2.4 does."""
    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(
        "import sandbox.interpreter_check as check\n"
        "check.interpreter_problem = lambda: 'simulated: the interpreter cannot loop'\n"
    )
    return fault


def test_the_check_runs_a_looping_kernel_in_the_interpreter() -> None:
    problem = cpu_interpreter_problem()  # in a process with TRITON_INTERPRET=1
    if _NUMPY_WITHOUT_SCALAR_ARRAYS and problem:  # Triton 3.6 with NumPy 2.4: named, with the fix
        assert np.__version__ in problem and "numpy<2.4" in problem
    else:
        assert problem == ""


def test_a_zygote_whose_interpreter_fails_does_not_start(tmp_path: Path) -> None:
    home = tmp_path / "zygote"
    home.mkdir()
    env = candidate_env(str(home), "cpu")
    env["PYTHONPATH"] += os.pathsep + str(_fault_dir(tmp_path))
    with pytest.raises(ZygoteError, match="simulated: the interpreter cannot loop"):
        Zygote("cpu", env)


def test_verify_on_such_a_host_is_an_error_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "DRTRITON_CANDIDATE_PYTHONPATH": str(_fault_dir(tmp_path))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "drtriton_cli",
            "verify",
            str(CASES_DIR / "problems" / "matmul_nt.py"),
            str(CASES_DIR / "honest" / "matmul_nt.py"),
            "--device",
            "cpu",
            "--allow-weak-isolation",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "simulated: the interpreter cannot loop" in proc.stderr
    assert "Traceback" not in proc.stderr
