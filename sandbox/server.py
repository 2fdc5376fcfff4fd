"""The gRPC face of a sandbox: `Sandbox` service, health and reflection over a JobRunner.

This layer only translates. Verdicts come from the runner; infrastructure problems
become RPC status codes (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE), and a
client's deadline becomes the job's time limit, so an abandoned job is killed
instead of occupying a worker. A job that the deadline (not its own budget) ended is
DEADLINE_EXCEEDED, never a `timeout` verdict: a learner must not score a kernel for
the caller's impatience or for time spent in the queue.

Lifecycle (`serve`): start the runner (it probes isolation and may refuse), bind,
print `listening on HOST:PORT` as the first stdout line, serve until SIGTERM/SIGINT,
then drain: health turns NOT_SERVING, new requests get UNAVAILABLE, in-flight jobs
finish and their answers are sent, and the process exits 0. A second signal stops
without waiting; a signal during start-up kills the workers at once and exits 0.

Who may call, and how much (`sandbox.auth`, `sandbox.limits`): a non-loopback address
needs TLS and client tokens (or `--insecure`); each client has a limit of requests in
flight and of source bytes per request; every verification is recorded in the audit log
(`sandbox.audit`) when one is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.audit import AuditLog, DenialThrottle, audit_entry
from sandbox.auth import (
    SecurityConfigError,
    ServerSecurity,
    TokenInterceptor,
    client_identity,
    load_server_security,
)
from sandbox.config import SandboxConfig, ServerConfig
from sandbox.errors import (
    DrainingError,
    InvalidRequestError,
    QueueFullError,
    SandboxInfrastructureError,
    WeakIsolationError,
)
from sandbox.limits import ClientLimitError, InFlightLimiter, check_source_size
from sandbox.result import VerifyResult

if TYPE_CHECKING:
    from sandbox.runner import JobRunner

log = logging.getLogger("drtriton.sandbox.server")


def _not_a_cancellation(record: logging.LogRecord) -> bool:
    """False for grpc's report of a call it cancelled itself (stopping without a grace
    period cancels every call still running): a traceback for what the operator asked."""
    error = record.exc_info[1] if record.exc_info else None
    return not isinstance(error, asyncio.CancelledError)


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sandbox"].full_name
# Answers carry a bounded candidate log and trial messages; requests are bounded tighter
# (`request_limit`), so a caller without a token cannot make the server read 64 MiB.
MAX_MESSAGE_BYTES = 64 * 2**20
# Calls at once (health watchers of callers without a token count too).
MAX_CONCURRENT_RPCS = 4096
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Clients keep idle connections alive with pings (fleet clients sit idle between steps).
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC enables SO_REUSEPORT by default: two servers on one port would silently share it.
    ("grpc.so_reuseport", 0),
]
# How many items of one VerifyStream are in flight at once; past that the server stops
# reading the stream, and HTTP/2 flow control holds the client back.
STREAM_WINDOW = 64
HEALTH_POLL_S = 1.0
# A `timeout` ending this close to the caller's deadline, with the job's own budget not
# used up (by this much), was the deadline's doing: DEADLINE_EXCEEDED, not a verdict.
DEADLINE_MARGIN_S = 1.5
BUDGET_SLACK_S = 0.25

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Runner(Protocol):
    """What the server needs from a job runner (`sandbox.runner.JobRunner`)."""

    async def start(self) -> None: ...

    async def verify(
        self, request: pb.VerifyRequest, timeout_s: float | None = None
    ) -> VerifyResult: ...

    def info(self) -> pb.GetInfoResponse: ...

    @property
    def healthy(self) -> bool: ...

    async def drain(self) -> None: ...

    async def close(self) -> None: ...

    def abort(self) -> None: ...


def request_limit(max_source_bytes: int) -> int:
    """The largest request message gRPC reads: the sources' limit plus room for the rest
    (MAX_MESSAGE_BYTES when sources are not limited)."""
    return max_source_bytes + 2**20 if max_source_bytes > 0 else MAX_MESSAGE_BYTES


class DeadlineCutError(Exception):
    """The client's deadline, not the kernel, ended the job."""


class HealthService(health_pb2_grpc.HealthServicer):
    """`grpc.health.v1.Health`, with one condition shared by all watchers.

    grpc_health's asyncio servicer drops a service's condition when any one of its
    watchers leaves, after which the remaining watchers (other clients' load
    balancers) never hear of a change; here watchers never lose each other.
    """

    def __init__(self) -> None:
        self._status: dict[str, int] = {"": _SERVING}
        self._changed = asyncio.Condition()
        self._frozen = False

    async def Check(  # noqa: N802 - gRPC method name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:  # the name is a caller's text: never echoed back whole
            shown = request.service[:100].encode("ascii", "replace").decode()
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {shown!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(  # noqa: N802 - gRPC method name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = None
        while True:
            status = self._current(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            try:
                async with self._changed:
                    await self._changed.wait_for(
                        functools.partial(self._differs, request.service, last)
                    )
            except asyncio.CancelledError:  # the client left, or the server stopped
                if not self._frozen:
                    raise
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the server stopped")

    def _current(self, service: str) -> int:
        return self._status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)

    def _differs(self, service: str, status: int) -> bool:
        return self._current(service) != status

    async def set(self, service: str, status: int) -> None:
        if self._frozen:
            return
        async with self._changed:
            self._status[service] = status
            self._changed.notify_all()

    async def shut_down(self) -> None:
        """Every service NOT_SERVING for good (draining)."""
        async with self._changed:
            self._frozen = True
            for service in self._status:
                self._status[service] = _NOT_SERVING
            self._changed.notify_all()


class SandboxService(sandbox_pb2_grpc.SandboxServicer):
    """`drtriton.sandbox.v1.Sandbox` over a runner: translation, per-client limits, audit."""

    def __init__(
        self,
        runner: Runner,
        stream_window: int = STREAM_WINDOW,
        default_budget_s: float | None = None,
        *,
        config: ServerConfig | None = None,
        security: ServerSecurity | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        config = config or ServerConfig()
        self._runner = runner
        self._stream_window = stream_window
        # A job's own budget when the request sets none (the runner's job timeout).
        if default_budget_s is None:
            default_budget_s = getattr(getattr(runner, "config", None), "job_timeout_s", None)
        self._default_budget_s = default_budget_s
        self._tokens = security.tokens if security is not None else None
        self._limiter = InFlightLimiter(config.max_in_flight_per_client)
        self._max_source_bytes = config.max_source_bytes
        self._audit = audit
        self._denials = DenialThrottle()
        self.draining = False

    def _record(
        self,
        method: str,
        client: str,
        context: grpc.aio.ServicerContext,
        request: pb.VerifyRequest | None,
        status: str,
        verdict: int | None,
        started: float,
    ) -> None:
        """One audit line for a finished request (nothing without an audit log)."""
        if self._audit is None:
            return
        self._audit.write(
            audit_entry(
                method=method,
                client=client,
                peer=context.peer() or "",
                status=status,
                seconds=time.monotonic() - started,
                request_id=request.request_id if request is not None else "",
                problem=request.problem if request is not None else None,
                candidate=request.candidate if request is not None else None,
                verdict=None if verdict is None else pb.Verdict.Name(verdict).lower(),
            )
        )

    def record_denied(self, method: str, context: grpc.aio.ServicerContext) -> None:
        """Audit a call refused for want of an accepted token: throttled per source, so
        callers without a token cannot fill the disk (`audit.DenialThrottle`)."""
        if self._audit is None:
            return
        client = client_identity(context, None)
        hidden = self._denials.admit(client, time.monotonic())
        if hidden is None:
            return
        entry = audit_entry(
            method=method.rsplit("/", 1)[-1],
            client=client,
            peer=context.peer() or "",
            status="UNAUTHENTICATED",
            seconds=0.0,
        )
        if hidden:
            entry["refused_not_logged"] = hidden  # since this source's previous line
        self._audit.write(entry)

    async def _run(
        self, request: pb.VerifyRequest, timeout_s: float | None, client: str
    ) -> pb.VerifyResponse:
        """One job of `client`; raises the runner's infrastructure errors unchanged."""
        if self.draining:
            raise DrainingError("the server is draining and takes no new jobs")
        check_source_size(request, self._max_source_bytes)
        self._limiter.take(client)  # held until the job ends, even if its caller leaves
        # When the client gives up (deadline, cancel) gRPC cancels this handler. The job
        # itself is already bounded by `timeout_s`; shielding it lets the runner account
        # for it until its grader has really answered, so a worker is never handed a
        # second job while still busy with an abandoned one.
        loop = asyncio.get_running_loop()
        started = loop.time()
        job = asyncio.ensure_future(self._runner.verify(request, timeout_s=timeout_s))
        job.add_done_callback(_consume_outcome)
        job.add_done_callback(lambda _job: self._limiter.release(client))
        result = await asyncio.shield(job)
        if timeout_s is not None and self._cut_by_deadline(
            request, result, timeout_s, loop.time() - started
        ):
            raise DeadlineCutError(
                f"the call's deadline ({timeout_s:.1f}s) ended the job before its own budget"
            )
        response = result.to_proto()
        response.request_id = request.request_id
        return response

    def _cut_by_deadline(
        self, request: pb.VerifyRequest, result: VerifyResult, timeout_s: float, spent_s: float
    ) -> bool:
        """Was a `timeout` forced by the client's deadline rather than the job's own budget?

        The runner stops a job just before the caller's deadline (and answers `timeout`
        for one that waited in the queue until then). That says nothing about the
        kernel, so it must not reach the client as a verdict.
        """
        if result.verdict != "timeout":
            return False
        if spent_s < timeout_s - DEADLINE_MARGIN_S:
            return False  # ended well before the deadline: its own budget ran out
        own = request.options.time_budget_s or self._default_budget_s
        return own is None or result.elapsed_s < own - BUDGET_SLACK_S

    async def Verify(  # noqa: N802 - gRPC method name
        self, request: pb.VerifyRequest, context: grpc.aio.ServicerContext
    ) -> pb.VerifyResponse:
        started = time.monotonic()
        client = client_identity(context, self._tokens)
        # Each outcome is recorded before the client hears of it.
        try:
            response = await self._run(request, context.time_remaining(), client)
        except asyncio.CancelledError:  # the client left, or the server stopped now
            self._record("Verify", client, context, request, "CANCELLED", None, started)
            if not self.draining:
                raise
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "the server stopped before the job ended"
            )
            raise
        except Exception as err:  # noqa: BLE001 - every error becomes a status
            code, details = status_of(err)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("Verify %r failed inside the server", request.request_id)
            self._record("Verify", client, context, request, code.name, None, started)
            await context.abort(code, details)
            raise AssertionError("unreachable") from err  # abort always raises
        self._record("Verify", client, context, request, "OK", response.verdict, started)
        return response

    async def VerifyStream(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[pb.VerifyRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.VerifyResponse]:
        """Items run concurrently; each answer is sent as soon as it is ready.

        An item that meets an infrastructure error is answered with verdict
        SANDBOX_ERROR and the status name leading the message (e.g.
        "RESOURCE_EXHAUSTED: ..."), so one bad item never ends the stream. An item
        without a request_id is keyed by its 0-based position in the stream.
        """
        answers: asyncio.Queue[pb.VerifyResponse | BaseException | None] = asyncio.Queue()
        window = asyncio.Semaphore(self._stream_window)
        jobs: set[asyncio.Task[None]] = set()
        client = client_identity(context, self._tokens)

        async def one(request: pb.VerifyRequest) -> None:
            started = time.monotonic()
            status, verdict = "CANCELLED", None
            try:
                # A stream's items wait for the client's places instead of being refused.
                await self._limiter.wait_for_room(client)
                answer = await self._run(request, context.time_remaining(), client)
                status, verdict = "OK", answer.verdict
            except Exception as err:  # noqa: BLE001 - every error becomes an answer
                code, details = status_of(err)
                status = code.name
                if code is grpc.StatusCode.INTERNAL:
                    log.exception("VerifyStream item %r failed", request.request_id)
                answer = pb.VerifyResponse(
                    request_id=request.request_id,
                    verdict=pb.SANDBOX_ERROR,
                    message=f"{code.name}: {details}",
                )
            finally:
                window.release()
                self._record("VerifyStream", client, context, request, status, verdict, started)
            await answers.put(answer)

        async def read_all() -> None:
            try:
                position = 0
                async for request in request_iterator:
                    if not request.request_id:
                        request.request_id = str(position)
                    position += 1
                    await window.acquire()
                    job = asyncio.create_task(one(request))
                    jobs.add(job)
                    job.add_done_callback(jobs.discard)
                while jobs:
                    await asyncio.wait(set(jobs))
                await answers.put(None)
            except BaseException as err:  # noqa: BLE001 - handed to the writer
                await answers.put(err)
                raise

        reader = asyncio.create_task(read_all())
        try:
            while True:
                item = await answers.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    if isinstance(item, asyncio.CancelledError):
                        return
                    raise item
                yield item
        finally:
            reader.cancel()
            for job in list(jobs):
                job.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def GetInfo(  # noqa: N802 - gRPC method name
        self, request: pb.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetInfoResponse:
        info = self._runner.info()
        info.serving = bool(not self.draining and self._runner.healthy)
        return info


def _consume_outcome(job: asyncio.Future[VerifyResult]) -> None:
    """Retrieve the outcome of a job nobody awaits any more (its client left)."""
    if not job.cancelled() and job.exception() is not None:
        log.debug("abandoned job ended with %r", job.exception())


def status_of(err: BaseException) -> tuple[grpc.StatusCode, str]:
    """The RPC status that tells a client what went wrong (never the kernel's fault)."""
    message = str(err) or type(err).__name__
    if isinstance(err, DeadlineCutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, message
    if isinstance(err, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, message
    if isinstance(err, QueueFullError | ClientLimitError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, message
    if isinstance(err, DrainingError):
        return grpc.StatusCode.UNAVAILABLE, message
    if isinstance(err, SandboxInfrastructureError):
        # e.g. a worker lost for reasons not the candidate's: another try may succeed.
        return grpc.StatusCode.UNAVAILABLE, message
    return grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {message}"


class SandboxServer:
    """A started gRPC server around a started runner.

    `security` (from `sandbox.auth.load_server_security`) brings TLS and client tokens;
    `config` the per-client limits and the audit log, which is opened here (OSError when
    it cannot be).
    """

    def __init__(
        self,
        runner: Runner,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        security: ServerSecurity | None = None,
        config: ServerConfig | None = None,
    ) -> None:
        config = config or ServerConfig()
        self.runner = runner
        self.host = host
        self.requested_port = port
        self.port = 0
        self.security = security or ServerSecurity()
        self.audit = AuditLog(config.audit_log) if config.audit_log else None
        self.max_request_bytes = request_limit(config.max_source_bytes)
        self.service = SandboxService(
            runner, config=config, security=self.security, audit=self.audit
        )
        self.health = HealthService()
        self._server: grpc.aio.Server | None = None
        self._monitor: asyncio.Task[None] | None = None

    @property
    def _unix(self) -> bool:
        return self.host.startswith(("unix:", "unix-abstract:"))

    @property
    def address(self) -> str:
        if self._unix:
            return self.host
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def bind(self) -> int:
        """Claim the address (before the slow runner start-up, so a busy port fails fast).

        Returns the port (0 for a unix socket); raises OSError when the address cannot
        be bound.
        """
        if self._server is not None:
            return self.port
        interceptors = []
        if self.security.tokens is not None:
            interceptors.append(
                TokenInterceptor(self.security.tokens, on_denied=self.service.record_denied)
            )
        server = grpc.aio.server(
            options=[*SERVER_OPTIONS, ("grpc.max_receive_message_length", self.max_request_bytes)],
            interceptors=interceptors,
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        sandbox_pb2_grpc.add_SandboxServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            server,
        )
        if self._unix:
            address = self.host
        else:
            host = f"[{self.host}]" if ":" in self.host else self.host
            address = f"{host}:{self.requested_port}"
        credentials = self.security.credentials
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError as err:  # grpc raises RuntimeError for a bind failure
            raise OSError(f"cannot listen on {address}: {err}") from err
        if port == 0 and not self._unix:
            raise OSError(f"cannot listen on {address}")
        self.port = port
        self._server = server
        return port

    async def start(self) -> None:
        """Serve (binding first if needed); the runner must be started already."""
        self.bind()
        assert self._server is not None
        await self._server.start()
        await self._update_health()
        self._monitor = asyncio.create_task(self._watch_health())

    async def _update_health(self) -> None:
        status = _SERVING if self.runner.healthy and not self.service.draining else _NOT_SERVING
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    async def _watch_health(self) -> None:
        """Follow the runner's device self-test into the health service."""
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            try:
                await self._update_health()
            except Exception:  # noqa: BLE001 - keep watching; a bad poll is not fatal
                log.exception("health update failed")

    async def drain(self) -> None:
        """Refuse new jobs (UNAVAILABLE, health NOT_SERVING); wait for in-flight ones."""
        self.service.draining = True
        await self.health.shut_down()
        await self.runner.drain()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop serving (answers still being sent get `grace_s`), then stop the runner."""
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        if self._server is not None:
            # Calls still running when the grace ends are cancelled: not an error to log.
            logging.getLogger("grpc._cython.cygrpc").addFilter(_not_a_cancellation)
            await self._server.stop(grace_s)
        await self.runner.close()
        if self.audit is not None:
            self.audit.close()


def _summary(
    info: pb.GetInfoResponse, config: SandboxConfig, security: ServerSecurity | None = None
) -> list[str]:
    """The lines after `listening on ...`: what an operator needs to know at a glance."""
    prov = info.provenance
    if info.mode == "cpu":
        device = "cpu (Triton interpreter: correctness only, no timing)"
    else:
        device = f"{info.mode} {prov.device}".strip()
        if prov.driver:
            device += f", driver {prov.driver}"
    lines = [
        f"device: {device}",
        f"versions: torch {prov.torch_version}, triton {prov.triton_version}, "
        f"python {prov.python_version}",
        f"workers: {info.workers}, queue capacity: {info.queue_capacity}",
    ]
    have = [f.name for f in info.isolation if f.available]
    missing = [f.name for f in info.isolation if not f.available]
    isolation = "isolation: " + (", ".join(have) if have else "none")
    if missing:
        isolation += f"; MISSING: {', '.join(missing)}"
        if info.weak_isolation_accepted or config.allow_weak_isolation:
            isolation += " (weaker isolation accepted)"
    lines.append(isolation)
    lines.append(f"clients: {(security or ServerSecurity()).describe()}")
    return lines


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


async def serve(
    config: SandboxConfig,
    host: str = "127.0.0.1",
    port: int = 50051,
    *,
    server_config: ServerConfig | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    drain_grace_s: float = 3.0,
) -> int:
    """Run a sandbox server until SIGTERM/SIGINT; returns the process exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    server_config = server_config or ServerConfig()
    security = _load_security(host, server_config, err)
    if security is None:
        return 2

    from sandbox.runner import JobRunner  # heavy (torch): only when serving

    loop = asyncio.get_running_loop()
    signals = asyncio.Queue[int]()
    installed = _install_signal_handlers(loop, signals)
    runner = JobRunner(config)
    try:
        server = _bind_server(runner, host, port, security, server_config, err)
        if server is None:
            return 2
        status = await _start_runner(runner, server, signals, config, err)
        if status is not None:
            return status

        await server.start()
        _announce(server, runner, config, security, out)
        return await _serve_until_signal(server, signals, err, drain_grace_s)
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _load_security(host: str, server_config: ServerConfig, err: TextIO) -> ServerSecurity | None:
    """TLS and client tokens for `host`, checked before anything starts so a misconfigured
    server never listens; None (after one line on `err`) when the configuration is
    refused. An exposed `--insecure` server is announced loudly on `err` and in the log."""
    try:
        security = load_server_security(host, server_config)
    except SecurityConfigError as error:
        print(f"drtriton: error: {_one_line(error)}", file=err, flush=True)
        return None
    if security.insecure_exposed:
        log.warning("serving %s without TLS or client tokens (--insecure)", host)
        print(
            f"WARNING: --insecure: serving {host}, which is not a loopback address, "
            f"with {security.describe()}: whoever reaches this port can run code in the "
            "sandbox and read its verdicts, and tokens cross the network in clear",
            file=err,
            flush=True,
        )
    return security


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, signals: asyncio.Queue[int]
) -> list[int]:
    """Turn SIGTERM/SIGINT into items of `signals`, so start-up and draining can wait on
    them; returns the signals handled (where the loop cannot, e.g. off the main thread,
    the default handling stays), for the caller to remove."""
    installed: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, signals.put_nowait, signum)
            installed.append(signum)
    return installed


def _bind_server(
    runner: Runner,
    host: str,
    port: int,
    security: ServerSecurity,
    server_config: ServerConfig,
    err: TextIO,
) -> SandboxServer | None:
    """Build the server and claim its address before the slow runner start-up, so a busy
    port or an unwritable audit log fails fast; None (after one line on `err`) when the
    address or the audit log cannot be opened."""
    try:
        server = SandboxServer(runner, host, port, security=security, config=server_config)
        server.bind()
    except OSError as error:
        print(f"drtriton: error: {_one_line(error)}", file=err, flush=True)
        return None
    return server


def _announce(
    server: SandboxServer,
    runner: JobRunner,
    config: SandboxConfig,
    security: ServerSecurity,
    out: TextIO,
) -> None:
    """`listening on HOST:PORT` as the first stdout line (callers wait for it to learn the
    port), then the summary an operator reads at a glance."""
    print(f"listening on {server.address}", file=out, flush=True)
    for line in _summary(runner.info(), config, security):
        print(line, file=out)
    if len(runner.gpu_shares) > 1:
        shares = ", ".join(f"{gpu} ({count})" for gpu, count in runner.gpu_shares)
        print(f"gpus (workers): {shares}", file=out)
    out.flush()


async def _serve_until_signal(
    server: SandboxServer, signals: asyncio.Queue[int], err: TextIO, drain_grace_s: float
) -> int:
    """Serve until a signal, then drain and stop; the exit status: 0 once drained, 130
    when a second signal cut the drain short."""
    signum = await signals.get()
    log.info("signal %d: draining", signum)
    print("draining: finishing in-flight jobs (signal again to stop now)", file=err, flush=True)
    forced = await _drain_unless_signalled(server, signals)
    # Drained: the answers left are being written; open health watches would hold
    # the whole grace period, so keep it short.
    await server.stop(0 if forced else drain_grace_s)
    print("stopped" + (" without draining" if forced else ""), file=err, flush=True)
    return 130 if forced else 0


async def _drain_unless_signalled(server: SandboxServer, signals: asyncio.Queue[int]) -> bool:
    """Let in-flight jobs finish, unless another signal comes first: an operator who
    signals again wants out now. True when the drain was cut short; a failed drain
    raises."""
    drain = asyncio.create_task(server.drain())
    again = asyncio.create_task(signals.get())
    await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
    forced = not drain.done()
    if forced:
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drain
    else:
        again.cancel()
        drain.result()
    return forced


async def _start_runner(
    runner: Runner,
    server: SandboxServer,
    signals: asyncio.Queue[int],
    config: SandboxConfig,
    err: TextIO,
) -> int | None:
    """Start the runner (workers import torch: seconds to minutes); None once it is up,
    else the exit status. A signal meanwhile kills the workers at once instead of letting
    them finish starting only to be stopped."""
    starting = asyncio.create_task(runner.start())
    stopped = asyncio.create_task(signals.get())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        runner.abort()
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        await server.stop(0)
        print("stopped before serving", file=err, flush=True)
        return 0
    stopped.cancel()
    try:
        starting.result()
    except WeakIsolationError as error:
        await server.stop(0)
        message = _one_line(error)
        if "--allow-weak-isolation" not in message:
            message += " (start with --allow-weak-isolation to accept weaker isolation)"
        print(f"drtriton: error: weak isolation: {message}", file=err, flush=True)
        return 2
    except Exception as error:  # noqa: BLE001 - one line for the operator, details in the log
        log.debug("runner start failed", exc_info=True)
        with contextlib.suppress(Exception):
            await server.stop(0)
        print(
            f"drtriton: error: cannot start the sandbox: {_one_line(error)}", file=err, flush=True
        )
        return 2
    return None


def run_server(
    config: SandboxConfig,
    host: str,
    port: int,
    *,
    server_config: ServerConfig | None = None,
    log_level: str = "WARNING",
) -> int:
    """Blocking entry point of `drtriton sandbox serve`."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.WARNING),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(serve(config, host, port, server_config=server_config))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were in place
        print("stopped before serving", file=sys.stderr, flush=True)
        return 130
