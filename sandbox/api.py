"""Verify kernels from Python without a server: the same isolated pipeline, locally.

    from sandbox.api import verify
    result = verify(problem_source, candidate_source, timing=False)
    print(result.verdict, result.message)

`LocalSandbox` keeps the grader workers (and their pre-started candidate
processes) alive across many calls; `verify` uses one shared instance.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from sandbox.config import SandboxConfig
from sandbox.result import VerifyResult
from sandbox.runner import JobRunner

_FORMATS = {
    "auto": pb.FORMAT_AUTO,
    "functional": pb.FORMAT_FUNCTIONAL,
    "kernelbench": pb.FORMAT_KERNELBENCH,
}


def build_request(
    problem: str,
    candidate: str,
    *,
    trials: int = 5,
    timing: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int | None = None,
    format: str = "auto",
    time_budget_s: float | None = None,
    request_id: str = "",
) -> pb.VerifyRequest:
    """The wire request for these arguments (shared with the gRPC client)."""
    if format not in _FORMATS:
        raise ValueError(f"format must be one of {sorted(_FORMATS)}")
    options = pb.VerifyOptions(trials=trials, timing=timing, time_budget_s=time_budget_s or 0.0)
    if atol is not None:
        options.atol = atol
    if rtol is not None:
        options.rtol = rtol
    if seed is not None:
        options.seed = seed
    return pb.VerifyRequest(
        request_id=request_id,
        problem=problem,
        candidate=candidate,
        format=_FORMATS[format],
        options=options,
    )


class LocalSandbox:
    """A JobRunner on a private event loop thread, with a synchronous API."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig(workers=1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="sandbox-loop"
        )
        self._thread.start()
        self.runner = JobRunner(self.config)
        self._run(self.runner.start())

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def verify(self, problem: str, candidate: str, **options: Any) -> VerifyResult:
        return self._run(self.runner.verify(build_request(problem, candidate, **options)))

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self.runner.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: LocalSandbox | None = None
_shared_lock = threading.Lock()


def verify(
    problem: str,
    candidate: str,
    *,
    device: str = "auto",
    allow_weak_isolation: bool = False,
    **options: Any,
) -> VerifyResult:
    """Verify one candidate locally (keywords as `build_request`)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LocalSandbox(
                SandboxConfig(workers=1, device=device, allow_weak_isolation=allow_weak_isolation)
            )
            atexit.register(_shared.close)
    return _shared.verify(problem, candidate, **options)
