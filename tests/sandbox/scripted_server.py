"""A `SandboxServer` in the test process over a runner scripted by the candidate's text.

The candidate says what the runner does: `invalid`, `full`, `draining`, `lost`, `bug`
raise the matching errors; `sleep:S` answers after S seconds; `wait` until `release` is
set; `timeout` behaves like the real runner at its budget or the deadline; anything else
is `correct` with the candidate as its message.
"""

from __future__ import annotations

import asyncio
import threading

import grpc

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.auth import ServerSecurity
from sandbox.config import ServerConfig
from sandbox.errors import (
    DrainingError,
    InvalidRequestError,
    QueueFullError,
    SandboxInfrastructureError,
)
from sandbox.result import VerifyResult
from sandbox.server import SandboxServer


class ScriptedRunner:
    """A runner whose answers are chosen by the candidate text (no processes)."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []
        self.healthy = True
        self.drained = False
        self.closed = False
        self.aborted = False
        self.release = asyncio.Event()
        self.running = 0
        self.most_running = 0

    async def start(self) -> None:
        return None

    async def verify(
        self, request: pb.VerifyRequest, timeout_s: float | None = None
    ) -> VerifyResult:
        self.timeouts.append(timeout_s)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            return await self._answer(request, timeout_s)
        finally:
            self.running -= 1

    async def _answer(self, request: pb.VerifyRequest, timeout_s: float | None) -> VerifyResult:
        kind, _, arg = request.candidate.partition(":")
        if kind == "invalid":
            raise InvalidRequestError("bad request")
        if kind == "full":
            raise QueueFullError("queue full")
        if kind == "draining":
            raise DrainingError("draining")
        if kind == "lost":
            raise SandboxInfrastructureError("worker lost")
        if kind == "bug":
            raise KeyError("oops")
        if kind == "sleep":
            await asyncio.sleep(float(arg))
        if kind == "wait":
            await self.release.wait()
        if kind == "timeout":  # like the runner: stop at the budget or just before the deadline
            budget = request.options.time_budget_s or 120.0
            if timeout_s is not None:
                budget = min(budget, timeout_s - 0.5)
            await asyncio.sleep(budget)
            return VerifyResult(verdict="timeout", elapsed_s=budget)
        return VerifyResult(verdict="correct", message=request.candidate)

    def info(self) -> pb.GetInfoResponse:
        return pb.GetInfoResponse(mode="cpu", workers=1, serving=True)

    async def drain(self) -> None:
        self.drained = True

    async def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


class InProcessServer:
    """A SandboxServer over a ScriptedRunner on an event loop thread of its own."""

    def __init__(
        self, security: ServerSecurity | None = None, config: ServerConfig | None = None
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = self.call(self._make_runner())
        self.server = SandboxServer(  # type: ignore[arg-type]
            self.runner, security=security, config=config
        )
        self.call(self.server.start())
        # Plaintext servers only; a TLS one is reached through a client with credentials.
        self.channel = grpc.insecure_channel(self.server.address)
        self.stub = sandbox_pb2_grpc.SandboxStub(self.channel)

    @staticmethod
    async def _make_runner() -> ScriptedRunner:
        return ScriptedRunner()  # its Event belongs to the server's loop

    def call(self, coroutine):  # noqa: ANN001, ANN201 - test helper
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        self.channel.close()
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
