"""Clients of a sandbox fleet: `SandboxClient` (blocking) and `AsyncSandboxClient`.

Neither imports torch or triton, so a learner host can use them as is.

- One channel for the whole fleet: several targets become one `ipv4:`/`ipv6:` address
  list (host names are resolved once, here), a `dns:///name:port` target resolves to
  every address of the name; gRPC's `round_robin` policy spreads calls over them and
  client-side health checking skips servers that say NOT_SERVING (draining, GPU
  failed). Calls are unary so that each one is balanced on its own.
- `timeout_s` bounds a whole `verify` call, retries included; the server learns the
  remaining time as the RPC deadline and kills the job when it runs out.
- Retries, with exponential backoff and jitter, only on UNAVAILABLE (server down or
  draining) and RESOURCE_EXHAUSTED (queue full): nothing else can succeed by trying
  again.
- TLS (`tls=ClientTls(...)`, mutual TLS with a client certificate) and a client token
  (`token=`, `token_file=`, or $DRTRITON_SANDBOX_TOKEN) for servers beyond loopback.
- Both clients share one core (`_Core`: target, credentials, deadline, retry policy,
  error mapping); they differ only in how they wait.
- A bad kernel is a `VerifyResult`, never an exception. When the sandbox cannot judge a
  job, `verify` raises a `SandboxInfrastructureError` subclass, and `verify_many`
  answers that item with verdict `sandbox_error` (the status and reason in `message`),
  which a learner masks instead of scoring.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.auth import ClientTls, client_token, is_loopback, token_metadata
from sandbox.errors import InvalidRequestError, SandboxInfrastructureError
from sandbox.result import VerifyResult

log = logging.getLogger("drtriton.sandbox.client")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Sandbox"].full_name
MAX_MESSAGE_BYTES = 64 * 2**20
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
FORMATS = {
    "auto": pb.FORMAT_AUTO,
    "functional": pb.FORMAT_FUNCTIONAL,
    "kernelbench": pb.FORMAT_KERNELBENCH,
}
BASELINES = {"eager": pb.EAGER, "compile": pb.TORCH_COMPILE, "torch_compile": pb.TORCH_COMPILE}
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")

# on_retry(attempt, code, delay_s): called before each backoff sleep (logging, tests).
RetryHook = Callable[[int, grpc.StatusCode, float], None]
Source = str | os.PathLike[str]


class SandboxRpcError(SandboxInfrastructureError):
    """The sandbox answered a call with an error status (not a verdict on the kernel)."""

    def __init__(self, code: grpc.StatusCode, details: str, attempts: int = 1) -> None:
        self.code = code
        self.details = details
        self.attempts = attempts
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"{code.name}: {details}{tries}")


class SandboxUnavailableError(SandboxRpcError):
    """No server took the job (down, draining, or queues full) before retries ran out."""


class SandboxTimeoutError(SandboxRpcError):
    """The call's deadline passed before an answer came (DEADLINE_EXCEEDED)."""


class SandboxInvalidRequestError(SandboxRpcError, InvalidRequestError):
    """The server refused the request as malformed (INVALID_ARGUMENT): fix the request."""


def rpc_error(code: grpc.StatusCode, details: str, attempts: int = 1) -> SandboxRpcError:
    """The exception class that says what kind of infrastructure failure this was."""
    if code in RETRYABLE_CODES:
        return SandboxUnavailableError(code, details, attempts)
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return SandboxTimeoutError(code, details, attempts)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return SandboxInvalidRequestError(code, details, attempts)
    return SandboxRpcError(code, details, attempts)


# -- addresses and channel settings ---------------------------------------------------


def _split_host_port(target: str) -> tuple[str, str]:
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        return host, rest.lstrip(":")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"sandbox target {target!r} is not HOST:PORT")
    return host, port


def _resolve(host: str, port: str) -> str:
    """One literal address for `host` (IPv4 preferred): `a.b.c.d:p` or `[v6]:p`."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        if not infos:
            raise ValueError(f"cannot resolve sandbox host {host!r}") from None
        infos.sort(key=lambda info: info[0] != socket.AF_INET)
        ip = ipaddress.ip_address(infos[0][4][0])
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def channel_target(targets: str | Sequence[str]) -> str:
    """The gRPC target naming every server of the fleet.

    "host:port" stays as it is; a URI ("dns:///sandbox.internal:50051", "ipv4:...") is
    passed through; several "host:port" (a list, or one comma-separated string) become
    one `ipv4:`/`ipv6:` address list for round_robin.
    """
    if isinstance(targets, str):
        targets = (
            [t.strip() for t in targets.split(",")]
            if "," in targets and not targets.startswith(_SCHEMES)
            else [targets]
        )
    targets = [t for t in targets if t]
    if not targets:
        raise ValueError("no sandbox target given")
    if len(targets) == 1:
        return targets[0]
    if any(t.startswith(_SCHEMES) for t in targets):
        raise ValueError("a URI target (dns:, ipv4:, ...) must be the only target")
    addresses = [_resolve(*_split_host_port(t)) for t in targets]
    v6 = [a.startswith("[") for a in addresses]
    if all(v6):
        return "ipv6:" + ",".join(addresses)
    if not any(v6):
        return "ipv4:" + ",".join(addresses)
    raise ValueError("cannot mix IPv4 and IPv6 sandbox addresses in one fleet")


def _loopback_target(target: str) -> bool:
    """Whether every address of a channel target is on this host."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    if target.startswith(("ipv4:", "ipv6:")):
        addresses = target.split(":", 1)[1].split(",")
    else:
        addresses = [target.removeprefix("dns:").lstrip("/")]
    try:
        return all(is_loopback(_split_host_port(address)[0]) for address in addresses)
    except ValueError:
        return False


def service_config() -> str:
    """round_robin over the fleet, skipping servers whose health is not SERVING."""
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": SERVICE_NAME},
        }
    )


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.service_config", service_config()),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Notice a dead server between training steps, not at the next call.
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A restarted server is found again within seconds (gRPC's default grows to 120 s).
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 5_000),
    ]


# -- requests --------------------------------------------------------------------------


def _source(value: Source) -> str:
    """Source text: a `str` is the source itself, a path-like is read."""
    if isinstance(value, str):
        return value
    return Path(value).read_text()


def build_request(
    problem: Source,
    candidate: Source,
    *,
    request_id: str | None = None,
    trials: int = 5,
    timing: bool = True,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int | None = None,
    format: str = "auto",  # noqa: A002 - mirrors the wire field
    time_budget_s: float | None = None,
    baselines: Sequence[str] | None = None,
) -> pb.VerifyRequest:
    """A `VerifyRequest` from keyword options (unset ones keep the server's defaults)."""
    if format not in FORMATS:
        raise ValueError(f"unknown problem format {format!r}: expected {', '.join(FORMATS)}")
    options = pb.VerifyOptions(trials=trials, timing=timing)
    if atol is not None:
        options.atol = atol
    if rtol is not None:
        options.rtol = rtol
    if seed is not None:
        options.seed = seed
    if time_budget_s is not None:
        options.time_budget_s = time_budget_s
    for name in baselines or ():
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}: expected eager or compile")
        options.baselines.append(BASELINES[name])
    return pb.VerifyRequest(
        request_id=request_id or uuid.uuid4().hex,
        problem=_source(problem),
        candidate=_source(candidate),
        format=FORMATS[format],
        options=options,
    )


def _item_kwargs(item: dict[str, Any] | tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    """`verify_many` items: {"problem", "candidate", **options} or (problem, candidate[, options])."""
    if isinstance(item, dict):
        return dict(item)
    if isinstance(item, (tuple, list)) and len(item) in (2, 3):
        kwargs = {"problem": item[0], "candidate": item[1]}
        if len(item) == 3:
            kwargs.update(item[2])
        return kwargs
    raise TypeError("a verify_many item is a dict or a (problem, candidate[, options]) tuple")


def infrastructure_result(err: BaseException, request_id: str = "") -> VerifyResult:
    """The `sandbox_error` answer standing for a job the sandbox could not judge."""
    message = str(err) if isinstance(err, SandboxRpcError) else f"{type(err).__name__}: {err}"
    return VerifyResult(verdict="sandbox_error", message=message, request_id=request_id)


def backoff_delay(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with jitter: in [d/2, d] for d = min(max, base * 2^attempt)."""
    delay = min(max_s, base_s * 2**attempt)
    return delay / 2 + random.uniform(0, delay / 2)


class _Core:
    """Everything both clients share: the channel's target, credentials and options, the
    token, deadlines and the retry policy. The clients only add their way of waiting."""

    def __init__(
        self,
        targets: str | Sequence[str],
        timeout_s: float,
        max_retries: int,
        backoff_base_s: float,
        backoff_max_s: float,
        on_retry: RetryHook | None,
        tls: ClientTls | bool | None,
        token: str | None,
        token_file: str | os.PathLike[str] | None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.target = channel_target(targets)
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.on_retry = on_retry
        self.tls = ClientTls() if tls is True else (tls or None)
        self.credentials = self.tls.credentials() if self.tls is not None else None
        self.options = channel_options() + (self.tls.channel_options() if self.tls else [])
        self.metadata = token_metadata(client_token(token, token_file))
        if self.metadata and self.credentials is None and not _loopback_target(self.target):
            log.warning(
                "sending a client token to %s without TLS: it crosses in clear", self.target
            )

    def channel(self, kind: Any) -> Any:
        """A channel of `kind` (the `grpc` or `grpc.aio` module) to the fleet."""
        if self.credentials is None:
            return kind.insecure_channel(self.target, options=self.options)
        return kind.secure_channel(self.target, self.credentials, options=self.options)

    def attempts(self, timeout_s: float | None) -> _Attempts:
        return _Attempts(self, time.monotonic() + (timeout_s or self.timeout_s))

    def next_delay(self, attempt: int, code: grpc.StatusCode, deadline: float) -> float | None:
        """Seconds to wait before another try, or None when the call should give up."""
        if code not in RETRYABLE_CODES or attempt >= self.max_retries:
            return None
        delay = backoff_delay(attempt, self.backoff_base_s, self.backoff_max_s)
        if time.monotonic() + delay >= deadline:
            return None
        if self.on_retry is not None:
            self.on_retry(attempt + 1, code, delay)
        log.debug("retry %d after %s in %.2fs", attempt + 1, code.name, delay)
        return delay


class _Attempts:
    """The tries of one call: the time left for the next, and what a failed one means."""

    def __init__(self, core: _Core, deadline: float) -> None:
        self._core = core
        self.deadline = deadline
        self.count = 0

    def remaining(self) -> float:
        """Seconds left for the next try; SandboxTimeoutError when none are."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxTimeoutError(
                grpc.StatusCode.DEADLINE_EXCEEDED, "no answer in time", self.count or 1
            )
        return left

    def failed(self, err: grpc.RpcError) -> float:
        """The delay before another try; raises the error's SandboxRpcError when none is due."""
        code, details = err.code(), err.details() or ""
        delay = self._core.next_delay(self.count, code, self.deadline)
        self.count += 1
        if delay is None:
            raise rpc_error(code, details, self.count) from None
        return delay

    def closed(self) -> SandboxUnavailableError:
        return SandboxUnavailableError(grpc.StatusCode.UNAVAILABLE, "client closed", self.count)


# What `verify_many` turns into a `sandbox_error` item rather than raising.
_UNJUDGED = (SandboxInfrastructureError, ValueError, TypeError, OSError)
_HEALTH_REQUEST = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
_SERVING = health_pb2.HealthCheckResponse.SERVING


# -- blocking client -------------------------------------------------------------------


class SandboxClient:
    """Blocking client of one sandbox server or a fleet of them (thread-safe).

    `tls`: a `ClientTls` (CA, client certificate for mutual TLS) or True for the system's
    roots; None is plaintext. `token` (or the first token in `token_file`, else
    $DRTRITON_SANDBOX_TOKEN) goes with every call as `authorization: Bearer TOKEN`.
    """

    def __init__(
        self,
        targets: str | list[str],
        *,
        timeout_s: float = 300,
        max_retries: int = 4,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 10.0,
        on_retry: RetryHook | None = None,
        tls: ClientTls | bool | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._core = _Core(
            targets,
            timeout_s,
            max_retries,
            backoff_base_s,
            backoff_max_s,
            on_retry,
            tls,
            token,
            token_file,
        )
        self.target = self._core.target
        self._channel = self._core.channel(grpc)
        self._stub = sandbox_pb2_grpc.SandboxStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._closed = threading.Event()

    def _call(self, method: Callable[..., Any], request: Any, timeout_s: float | None) -> Any:
        attempts = self._core.attempts(timeout_s)
        while True:
            try:
                return method(request, timeout=attempts.remaining(), metadata=self._core.metadata)
            except grpc.RpcError as err:
                delay = attempts.failed(err)
            if self._closed.wait(delay):
                raise attempts.closed()

    def verify(
        self,
        problem: Source,
        candidate: Source,
        *,
        trials: int = 5,
        timing: bool = True,
        atol: float | None = None,
        rtol: float | None = None,
        seed: int | None = None,
        format: str = "auto",  # noqa: A002 - mirrors the wire field
        time_budget_s: float | None = None,
        request_id: str | None = None,
        baselines: Sequence[str] | None = None,
        timeout_s: float | None = None,
    ) -> VerifyResult:
        """Judge one candidate; raises `SandboxInfrastructureError` when no server could."""
        request = build_request(
            problem,
            candidate,
            request_id=request_id,
            trials=trials,
            timing=timing,
            atol=atol,
            rtol=rtol,
            seed=seed,
            format=format,
            time_budget_s=time_budget_s,
            baselines=baselines,
        )
        return VerifyResult.from_proto(self._call(self._stub.Verify, request, timeout_s))

    def verify_many(
        self,
        items: Iterable[dict[str, Any] | tuple[Any, ...]],
        *,
        concurrency: int = 32,
        progress: bool = False,
    ) -> list[VerifyResult]:
        """Judge many candidates, `concurrency` calls at a time; results in input order.

        Never raises for one item: an item the sandbox could not judge gets verdict
        `sandbox_error` (a malformed item too, with INVALID_ARGUMENT in its message).
        """
        jobs = [_item_kwargs(item) for item in items]
        results: list[VerifyResult | None] = [None] * len(jobs)
        if not jobs:
            return []

        def one(kwargs: dict[str, Any]) -> VerifyResult:
            request_id = kwargs.get("request_id") or uuid.uuid4().hex
            try:
                return self.verify(**{**kwargs, "request_id": request_id})
            except _UNJUDGED as err:
                return infrastructure_result(err, request_id)

        with (
            ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs)))) as pool,
            _Progress(len(jobs), progress) as bar,
        ):
            futures = {pool.submit(one, kwargs): i for i, kwargs in enumerate(jobs)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                bar.advance()
        return [r for r in results if r is not None]

    def info(self, timeout_s: float | None = 30) -> pb.GetInfoResponse:
        """GetInfo of one server of the fleet (the one round_robin picks)."""
        return self._call(self._stub.GetInfo, pb.GetInfoRequest(), timeout_s)

    def health(self, timeout_s: float = 5) -> bool:
        """True when a server of the fleet answers SERVING for the Sandbox service."""
        try:
            response = self._health.Check(
                _HEALTH_REQUEST, timeout=timeout_s, metadata=self._core.metadata
            )
        except grpc.RpcError:
            return False
        return response.status == _SERVING

    def close(self) -> None:
        self._closed.set()
        self._channel.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- asyncio client --------------------------------------------------------------------


class AsyncSandboxClient:
    """asyncio client with the same behaviour and arguments; the channel opens on first use."""

    def __init__(
        self,
        targets: str | list[str],
        *,
        timeout_s: float = 300,
        max_retries: int = 4,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 10.0,
        on_retry: RetryHook | None = None,
        tls: ClientTls | bool | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._core = _Core(
            targets,
            timeout_s,
            max_retries,
            backoff_base_s,
            backoff_max_s,
            on_retry,
            tls,
            token,
            token_file,
        )
        self.target = self._core.target
        self._channel: grpc.aio.Channel | None = None

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = self._core.channel(grpc.aio)
        return self._channel

    async def _call(self, method_name: str, request: Any, timeout_s: float | None) -> Any:
        method = getattr(sandbox_pb2_grpc.SandboxStub(self._open()), method_name)
        attempts = self._core.attempts(timeout_s)
        while True:
            try:
                return await method(
                    request, timeout=attempts.remaining(), metadata=self._core.metadata
                )
            except grpc.aio.AioRpcError as err:
                delay = attempts.failed(err)
            await asyncio.sleep(delay)

    async def verify(
        self,
        problem: Source,
        candidate: Source,
        *,
        trials: int = 5,
        timing: bool = True,
        atol: float | None = None,
        rtol: float | None = None,
        seed: int | None = None,
        format: str = "auto",  # noqa: A002 - mirrors the wire field
        time_budget_s: float | None = None,
        request_id: str | None = None,
        baselines: Sequence[str] | None = None,
        timeout_s: float | None = None,
    ) -> VerifyResult:
        """Judge one candidate; raises `SandboxInfrastructureError` when no server could."""
        request = build_request(
            problem,
            candidate,
            request_id=request_id,
            trials=trials,
            timing=timing,
            atol=atol,
            rtol=rtol,
            seed=seed,
            format=format,
            time_budget_s=time_budget_s,
            baselines=baselines,
        )
        return VerifyResult.from_proto(await self._call("Verify", request, timeout_s))

    async def verify_many(
        self,
        items: Iterable[dict[str, Any] | tuple[Any, ...]],
        *,
        concurrency: int = 32,
        progress: bool = False,
    ) -> list[VerifyResult]:
        """As `SandboxClient.verify_many`: input order, `sandbox_error` for unjudged items."""
        jobs = [_item_kwargs(item) for item in items]
        gate = asyncio.Semaphore(max(1, concurrency))

        with _Progress(len(jobs), progress) as bar:

            async def one(kwargs: dict[str, Any]) -> VerifyResult:
                request_id = kwargs.get("request_id") or uuid.uuid4().hex
                async with gate:
                    try:
                        return await self.verify(**{**kwargs, "request_id": request_id})
                    except _UNJUDGED as err:
                        return infrastructure_result(err, request_id)
                    finally:
                        bar.advance()

            return list(await asyncio.gather(*(one(kwargs) for kwargs in jobs)))

    async def info(self, timeout_s: float | None = 30) -> pb.GetInfoResponse:
        return await self._call("GetInfo", pb.GetInfoRequest(), timeout_s)

    async def health(self, timeout_s: float = 5) -> bool:
        stub = health_pb2_grpc.HealthStub(self._open())
        try:
            response = await stub.Check(
                _HEALTH_REQUEST, timeout=timeout_s, metadata=self._core.metadata
            )
        except grpc.aio.AioRpcError:
            return False
        return response.status == _SERVING

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Progress:
    """A rich progress bar on stderr, or nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        self._task: Any = None
        self._lock = threading.Lock()
        if enabled and total:
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task("verifying", total=total)

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
