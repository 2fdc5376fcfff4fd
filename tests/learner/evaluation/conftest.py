"""A CPU sandbox server for the session and small policies of the tests' own."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pytest

from learner.policies.base import Proposal

NOT_PYTHON = "def triton_fused_operator(:\n"


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[str]:
    """`drtriton sandbox serve` on CPU for the session: "127.0.0.1:PORT". Weaker isolation
    is accepted only when asked for (DRTRITON_TEST_WEAK_ISOLATION=1)."""
    from learner.train.verify import start_local_sandbox

    weak = os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1"
    with start_local_sandbox(workers=2, device="cpu", allow_weak_isolation=weak) as target:
        yield target


@pytest.fixture
def sandbox_client(sandbox_server: str) -> Iterator[object]:
    from sandbox.client import SandboxClient

    with SandboxClient(sandbox_server, timeout_s=300) as client:
        yield client


class TeacherThenJunk:
    """Sample 0 is the teacher's kernel; sample 1 has no code on even problems (of a batch)
    and code that does not parse on odd ones; later samples repeat the teacher. Records
    every call, and can be told to fail on its n-th call (a run killed part-way)."""

    name = "teacher-then-junk"

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.calls: list[tuple[int, int, int]] = []
        self.fail_on_call = fail_on_call

    def propose(
        self, problems: Sequence[str], samples: int = 1, seed: int = 0
    ) -> list[list[Proposal]]:
        from synth.teacher import translate

        self.calls.append((len(problems), samples, seed))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("policy stopped (simulated kill)")
        out = []
        for index, source in enumerate(problems):
            code = translate(source).code
            junk = Proposal(code=None, error="no code block") if index % 2 == 0 else None
            junk = junk or Proposal(code=NOT_PYTHON)
            out.append([junk if i == 1 else Proposal(code=code) for i in range(samples)])
        return out
