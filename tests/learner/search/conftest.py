"""A CPU sandbox server for the search tests that judge real kernels."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def search_sandbox() -> Iterator[str]:
    """`drtriton sandbox serve` on CPU: "127.0.0.1:PORT". Skipped where Triton's interpreter
    cannot run; weaker isolation only when asked for (DRTRITON_TEST_WEAK_ISOLATION=1)."""
    from learner.train.verify import start_local_sandbox
    from tests.sandbox.conftest import cpu_interpreter_problem

    problem = cpu_interpreter_problem()
    if problem:
        pytest.skip(problem)
    weak = os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1"
    with start_local_sandbox(workers=2, device="cpu", allow_weak_isolation=weak) as target:
        yield target


@pytest.fixture
def search_client(search_sandbox: str) -> Iterator[object]:
    from sandbox.client import SandboxClient

    with SandboxClient(search_sandbox, timeout_s=300) as client:
        yield client
