"""Serving beyond loopback: TLS, client tokens, per-client limits, the audit log, and a
start-up cut short by Ctrl-C.

Certificates are made here, for each test session, by a throwaway CA. Most checks run
against the gRPC layer in this process over a scripted runner; three start real servers
(a refused exposed address, a TLS server judging a real kernel, Ctrl-C during start-up).
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.audit import AuditLog, audit_entry
from sandbox.auth import (
    ClientTls,
    SecurityConfigError,
    TokenSet,
    bearer_token,
    client_token,
    is_loopback,
    load_server_security,
    peer_host,
)
from sandbox.client import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxInvalidRequestError,
    SandboxRpcError,
    SandboxTimeoutError,
    SandboxUnavailableError,
)
from sandbox.config import ServerConfig
from sandbox.limits import ClientLimitError, InFlightLimiter
from tests.sandbox.conftest import (
    GOOD_RELU,
    RELU_PROBLEM,
    REPO_ROOT,
    ServerProcess,
    server_args,
    wait_until,
)
from tests.sandbox.scripted_server import InProcessServer

TOKEN = "learner-one-token-0123456789abcdef"
OTHER_TOKEN = "learner-two-token-fedcba9876543210"

# -- a throwaway PKI ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA nobody trusts


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate | None = None, key: object | None = None) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(
            key.private_bytes(  # type: ignore[attr-defined]
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("DRTriton test CA", ca_key, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    other_key = ec.generate_private_key(ec.SECP256R1())
    return Pki(
        ca=_write(root / "ca.pem", ca),
        server_cert=_write(
            root / "server.pem",
            _certificate("localhost", server_key, (ca.subject, ca_key), server=True),
        ),
        server_key=_write(root / "server.key", key=server_key),
        client_cert=_write(
            root / "client.pem", _certificate("learner-1", client_key, (ca.subject, ca_key))
        ),
        client_key=_write(root / "client.key", key=client_key),
        other_ca=_write(root / "other-ca.pem", _certificate("nobody", other_key, None, ca=True)),
    )


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(f"# clients\nlearner-1 {TOKEN}\n\nlearner-2 {OTHER_TOKEN}\n")
    return path


# -- addresses, tokens, settings --------------------------------------------------------------


def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "unix:/tmp/s.sock"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.1.2.3", "gpu-0.internal", "192.168.0.1"):
        assert not is_loopback(host), host


def test_tokens_are_named_compared_and_never_short(tmp_path: Path, token_file: Path) -> None:
    tokens = TokenSet.from_file(token_file)
    assert len(tokens) == 2
    assert tokens.identify(TOKEN) == "learner-1"
    assert tokens.identify(OTHER_TOKEN) == "learner-2"
    assert tokens.identify(TOKEN[:-1]) is None
    assert tokens.identify("") is None and tokens.identify(None) is None
    short = _lines(tmp_path, "learner short")
    with pytest.raises(SecurityConfigError, match="at least 16 characters"):
        TokenSet.from_file(short)
    with pytest.raises(SecurityConfigError, match="no client token"):
        TokenSet.from_file(_lines(tmp_path, "# nothing here"))


def _lines(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lines"
    path.write_text(text + "\n")
    return path


def test_an_unnamed_token_is_known_by_its_digest_not_its_text(tmp_path: Path) -> None:
    tokens = TokenSet.from_file(_lines(tmp_path, TOKEN))
    name = tokens.identify(TOKEN)
    assert name == hashlib.sha256(TOKEN.encode()).hexdigest()[:12]
    assert TOKEN not in name


def test_bearer_token_and_client_token_sources(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    assert bearer_token([("authorization", f"Bearer {TOKEN}")]) == TOKEN
    assert bearer_token([("Authorization", f"bearer  {TOKEN} ")]) == TOKEN
    assert bearer_token([("authorization", f"Basic {TOKEN}")]) is None
    assert bearer_token([("x-other", "1")]) is None and bearer_token(None) is None
    monkeypatch.delenv("DRTRITON_SANDBOX_TOKEN", raising=False)
    assert client_token() is None
    monkeypatch.setenv("DRTRITON_SANDBOX_TOKEN", OTHER_TOKEN)
    assert client_token() == OTHER_TOKEN
    assert client_token(TOKEN) == TOKEN
    assert client_token(token_file=_lines(tmp_path, f"learner-1 {TOKEN}")) == TOKEN
    with pytest.raises(SecurityConfigError, match="not both"):
        client_token(TOKEN, token_file=tmp_path / "lines")


def test_exposed_address_needs_tls_and_tokens(pki: Pki, token_file: Path) -> None:
    tls = {"tls_cert": str(pki.server_cert), "tls_key": str(pki.server_key)}
    with pytest.raises(SecurityConfigError) as refused:
        load_server_security("0.0.0.0", ServerConfig())
    assert "--tls-cert" in str(refused.value) and "--token-file" in str(refused.value)
    assert "--insecure" in str(refused.value)
    with pytest.raises(SecurityConfigError, match="client tokens"):
        load_server_security("0.0.0.0", ServerConfig(**tls))
    with pytest.raises(SecurityConfigError, match="TLS"):
        load_server_security("10.0.0.1", ServerConfig(token_file=str(token_file)))
    secured = load_server_security("0.0.0.0", ServerConfig(**tls, token_file=str(token_file)))
    assert secured.credentials is not None and secured.tokens is not None
    assert not secured.insecure_exposed
    anyway = load_server_security("0.0.0.0", ServerConfig(insecure=True))
    assert anyway.insecure_exposed and anyway.credentials is None
    local = load_server_security("127.0.0.1", ServerConfig())
    assert not local.insecure_exposed and local.tokens is None


def test_unusable_tls_files_are_refused_at_start(pki: Pki, tmp_path: Path) -> None:
    mismatched = ServerConfig(tls_cert=str(pki.server_cert), tls_key=str(pki.client_key))
    with pytest.raises(SecurityConfigError, match="unusable TLS certificate"):
        load_server_security("127.0.0.1", mismatched)
    missing = ServerConfig(tls_cert=str(tmp_path / "none.pem"), tls_key=str(pki.server_key))
    with pytest.raises(SecurityConfigError, match="none.pem"):
        load_server_security("127.0.0.1", missing)
    with pytest.raises(SecurityConfigError, match="go together"):
        load_server_security("127.0.0.1", ServerConfig(tls_cert=str(pki.server_cert)))


# -- limits and the audit log as units ---------------------------------------------------------


def test_in_flight_limiter_refuses_or_waits_per_client() -> None:
    async def main() -> None:
        limiter = InFlightLimiter(2)
        limiter.take("a")
        limiter.take("a")
        with pytest.raises(ClientLimitError, match="2 requests in flight"):
            limiter.take("a")
        limiter.take("b")  # another client is not held back
        room = asyncio.create_task(limiter.wait_for_room("a"))
        await asyncio.sleep(0.05)
        assert not room.done(), "waiting for room must wait for the client's jobs"
        limiter.release("a")
        await asyncio.wait_for(room, 5)
        for client in ("a", "b"):
            limiter.release(client)
        assert limiter.in_flight("a") == 0 and not limiter._counts, "no client left behind"
        unlimited = InFlightLimiter(0)
        for _ in range(1000):
            unlimited.take("a")

    asyncio.run(main())


def test_audit_lines_stay_whole_under_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    logs = [AuditLog(path) for _ in range(4)]  # separate descriptors, like separate servers
    big = "x" * 50_000

    def write(log: AuditLog, n: int) -> None:
        for i in range(100):
            entry = audit_entry(
                method="Verify", client=f"c{n}", peer="p", status="OK", seconds=0.1,
                request_id=f"{n}-{i}", problem=big, candidate=str(i), verdict="correct",
            )  # fmt: skip
            entry["padding"] = big  # lines far longer than a pipe's atomic size
            log.write(entry)

    threads = [threading.Thread(target=write, args=(log, n)) for n, log in enumerate(logs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for log in logs:
        log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 400
    ids = {json.loads(line)["request_id"] for line in lines}
    assert len(ids) == 400
    assert os.stat(path).st_mode & 0o077 == 0, "the audit log is the owner's alone"


# -- the gRPC layer in this process -------------------------------------------------------------


@pytest.fixture
def tls_server(pki: Pki, token_file: Path, tmp_path: Path) -> Iterator[InProcessServer]:
    """TLS, two client tokens, one job in flight per client, 1000 source bytes, an audit log."""
    config = ServerConfig(
        tls_cert=str(pki.server_cert),
        tls_key=str(pki.server_key),
        token_file=str(token_file),
        max_in_flight_per_client=1,
        max_source_bytes=1000,
        audit_log=str(tmp_path / "audit.jsonl"),
    )
    server = InProcessServer(load_server_security("0.0.0.0", config), config)
    yield server
    server.close()


def _client(server: InProcessServer, pki: Pki, **kwargs: object) -> SandboxClient:
    kwargs.setdefault("tls", ClientTls(ca_file=pki.ca))
    return SandboxClient(server.server.address, max_retries=0, timeout_s=20, **kwargs)  # type: ignore[arg-type]


def _audit(server: InProcessServer) -> list[dict[str, object]]:
    assert server.server.audit is not None
    return [json.loads(line) for line in Path(server.server.audit.path).read_text().splitlines()]


def test_calls_without_the_right_token_are_unauthenticated(
    tls_server: InProcessServer, pki: Pki, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.delenv("DRTRITON_SANDBOX_TOKEN", raising=False)
    for token in (None, "a-wrong-token-0123456789abcdef"):
        with _client(tls_server, pki, token=token) as client:
            assert client.health(), "health needs no token"
            with pytest.raises(SandboxRpcError) as refused:
                client.verify("p", "ok")
            assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in refused.value.details
            with pytest.raises(SandboxRpcError) as info:
                client.info()
            assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert tls_server.runner.timeouts == [], "no refused call reached the runner"
    denied = _audit(tls_server)
    # One line per source every few seconds: refused calls cost the caller nothing, so
    # one line each would let anyone reaching the port fill the disk.
    assert [(d["status"], d["method"]) for d in denied] == [("UNAUTHENTICATED", "Verify")]


def test_refused_calls_are_logged_once_per_window_with_a_count() -> None:
    from sandbox.audit import DenialThrottle

    throttle = DenialThrottle(interval_s=10.0, max_sources=2)
    assert throttle.admit("peer-a", now=0.0) == 0
    assert [throttle.admit("peer-a", now=t) for t in (1.0, 2.0, 9.9)] == [None] * 3
    assert throttle.admit("peer-b", now=5.0) == 0  # sources are counted apart
    assert throttle.admit("peer-a", now=10.5) == 3  # the next line carries the count
    assert throttle.admit("peer-c", now=30.0) == 0  # a full table drops stale sources
    assert throttle.admit("peer-a", now=31.0) == 0


def test_the_right_token_over_tls_is_served_and_audited(
    tls_server: InProcessServer, pki: Pki
) -> None:
    with _client(tls_server, pki, token=TOKEN) as client:
        result = client.verify("problem text", "ok", request_id="r-1")
        assert result.verdict == "correct" and result.request_id == "r-1"
        assert client.info().workers == 1

    async def async_call() -> str:
        async with AsyncSandboxClient(
            tls_server.server.address, tls=ClientTls(ca_file=pki.ca), token=OTHER_TOKEN
        ) as client:
            return (await client.verify("p", "async")).verdict

    assert asyncio.run(async_call()) == "correct"
    [first, second] = _audit(tls_server)
    assert first["client"] == "token:learner-1" and second["client"] == "token:learner-2"
    assert first["request_id"] == "r-1" and first["verdict"] == "correct"
    assert first["status"] == "OK" and first["method"] == "Verify"
    assert first["problem_sha256"] == hashlib.sha256(b"problem text").hexdigest()
    assert first["candidate_sha256"] == hashlib.sha256(b"ok").hexdigest()
    assert str(first["peer"]).startswith("ipv4:127.0.0.1:")
    stamp = datetime.datetime.fromisoformat(str(first["time"]).replace("Z", "+00:00"))
    assert stamp.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.UTC) - stamp).total_seconds()) < 60
    assert 0 <= float(first["seconds"]) < 20  # type: ignore[arg-type]


def test_a_plaintext_client_cannot_talk_to_a_tls_server(
    tls_server: InProcessServer, pki: Pki
) -> None:
    with (
        _client(tls_server, pki, tls=None, token=TOKEN) as client,
        pytest.raises(SandboxUnavailableError),
    ):
        client.verify("p", "ok", timeout_s=5)
    untrusted = ClientTls(ca_file=pki.other_ca)
    with (
        _client(tls_server, pki, tls=untrusted, token=TOKEN) as client,
        pytest.raises(SandboxUnavailableError),
    ):
        client.verify("p", "ok", timeout_s=5)


def test_reflection_and_streams_need_the_token_too(tls_server: InProcessServer, pki: Pki) -> None:
    credentials = ClientTls(ca_file=pki.ca).credentials()
    with grpc.secure_channel(tls_server.server.address, credentials) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            ProtoReflectionDescriptorDatabase(channel).get_services()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        items = [pb.VerifyRequest(problem="p", candidate="ok", request_id="s")]
        with pytest.raises(grpc.RpcError) as stream:
            list(stub.VerifyStream(iter(items), timeout=10))
        assert stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers = list(
            stub.VerifyStream(
                iter(items), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
            )
        )
        assert [a.verdict for a in answers] == [pb.CORRECT]


def test_a_client_over_its_in_flight_limit_is_resource_exhausted(
    tls_server: InProcessServer, pki: Pki
) -> None:
    with (
        _client(tls_server, pki, token=TOKEN) as first,
        _client(tls_server, pki, token=OTHER_TOKEN) as second,
    ):
        held = threading.Thread(target=first.verify, args=("p", "wait"))
        held.start()
        wait_until(lambda: tls_server.runner.running == 1, 10, "the first job to run")
        with pytest.raises(SandboxUnavailableError) as refused:
            first.verify("p", "ok")
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "token:learner-1 already has 1 requests in flight" in refused.value.details
        assert second.verify("p", "ok").verdict == "correct", "another client is not held back"
        tls_server.loop.call_soon_threadsafe(tls_server.runner.release.set)
        held.join(10)
        assert first.verify("p", "ok").verdict == "correct", "the place is free again"


def test_an_abandoned_job_keeps_its_clients_place_until_it_ends(
    tls_server: InProcessServer, pki: Pki
) -> None:
    with _client(tls_server, pki, token=TOKEN) as client:
        with pytest.raises(SandboxTimeoutError):
            client.verify("p", "wait", timeout_s=0.5)  # the job runs on without its caller
        assert tls_server.runner.running == 1
        with pytest.raises(SandboxUnavailableError) as refused:
            client.verify("p", "ok")
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        tls_server.loop.call_soon_threadsafe(tls_server.runner.release.set)
        wait_until(lambda: tls_server.runner.running == 0, 10, "the abandoned job to end")
        assert client.verify("p", "ok").verdict == "correct"


def test_a_stream_waits_for_the_clients_places(tls_server: InProcessServer, pki: Pki) -> None:
    credentials = ClientTls(ca_file=pki.ca).credentials()
    with grpc.secure_channel(tls_server.server.address, credentials) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        items = [
            pb.VerifyRequest(problem="p", candidate="sleep:0.2", request_id=str(i))
            for i in range(4)
        ]
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        answers = list(stub.VerifyStream(iter(items), timeout=20, metadata=metadata))
    assert sorted(a.request_id for a in answers) == ["0", "1", "2", "3"]
    assert all(a.verdict == pb.CORRECT for a in answers), [a.message for a in answers]
    assert tls_server.runner.most_running == 1, "one client, one job in flight at a time"


def test_sources_over_the_size_limit_are_invalid_argument(
    tls_server: InProcessServer, pki: Pki
) -> None:
    with _client(tls_server, pki, token=TOKEN) as client:
        assert client.verify("p" * 500, "ok" * 249).verdict == "correct"  # 998 bytes
        with pytest.raises(SandboxInvalidRequestError) as refused:
            client.verify("p" * 500, "ok" * 251)  # 1002 bytes
    assert "1002 bytes together" in refused.value.details
    assert "at most 1000 bytes" in refused.value.details
    assert _audit(tls_server)[-1]["status"] == "INVALID_ARGUMENT"


def test_mutual_tls_needs_a_client_certificate(pki: Pki, token_file: Path, tmp_path: Path) -> None:
    config = ServerConfig(
        tls_cert=str(pki.server_cert),
        tls_key=str(pki.server_key),
        tls_client_ca=str(pki.ca),
        audit_log=str(tmp_path / "audit.jsonl"),
    )
    server = InProcessServer(load_server_security("127.0.0.1", config), config)
    try:
        with _client(server, pki) as anonymous, pytest.raises(SandboxUnavailableError):
            anonymous.verify("p", "ok", timeout_s=5)
        mutual = ClientTls(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
        with _client(server, pki, tls=mutual) as client:
            assert client.verify("p", "ok").verdict == "correct"
        [line] = _audit(server)
        assert line["client"] == "cert:CN=learner-1", line
    finally:
        server.close()


# -- real servers ---------------------------------------------------------------------------


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "drtriton_cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_an_exposed_plaintext_server_is_refused() -> None:
    refused = _serve("sandbox", "serve", "--host", "0.0.0.0", "--port", "0", "--device", "cpu")
    assert refused.returncode == 2, refused.stderr
    assert refused.stdout == ""
    [line] = [line for line in refused.stderr.splitlines() if line.strip()]
    assert line.startswith("drtriton: error: refusing to serve on 0.0.0.0")
    for flag in ("--tls-cert", "--token-file", "--insecure"):
        assert flag in line


def test_a_tls_server_with_tokens_verifies_a_real_kernel(
    pki: Pki, token_file: Path, tmp_path: Path, cpu_candidates: None
) -> None:
    audit = tmp_path / "audit.jsonl"
    server = ServerProcess(
        *server_args(1),
        "--host", "0.0.0.0",
        "--tls-cert", str(pki.server_cert),
        "--tls-key", str(pki.server_key),
        "--token-file", str(token_file),
        "--audit-log", str(audit),
    )  # fmt: skip
    try:
        server.wait_listening()
        wait_until(
            lambda: any(line.startswith("clients: ") for line in server.stdout), 30, "the summary"
        )
        assert "clients: TLS, 2 client token(s)\n" in server.stdout, server.stdout
        with SandboxClient(
            server.target, tls=ClientTls(ca_file=pki.ca), token=TOKEN, timeout_s=120
        ) as client:
            result = client.verify(RELU_PROBLEM, GOOD_RELU, timing=False, request_id="real")
        assert result.verdict == "correct", result.message
        access = ["--server", server.target, "--tls-ca", str(pki.ca)]
        refused = _serve("sandbox", "info", *access, env={"DRTRITON_SANDBOX_TOKEN": ""})
        assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stderr
        info = _serve("sandbox", "info", *access, "--json", "--token-file", str(token_file))
        assert info.returncode == 0, info.stderr
        assert json.loads(info.stdout)["workers"] == 1
    except BaseException:
        server.kill()
        raise
    assert server.terminate() == 0, "".join(server.stderr)
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    verified = [line for line in lines if line["method"] == "Verify"]
    assert [(v["request_id"], v["verdict"], v["client"]) for v in verified] == [
        ("real", "correct", "token:learner-1")
    ]
    assert [line["status"] for line in lines if line["method"] == "GetInfo"] == ["UNAUTHENTICATED"]


def test_ctrl_c_stops_a_starting_server_at_once(monkeypatch) -> None:  # noqa: ANN001
    """Workers held in start-up for minutes; SIGINT must end the server and every worker
    within seconds. Also: --insecure lets an exposed address start, with a warning."""
    marker = os.urandom(8).hex()
    monkeypatch.setenv("DRTRITON_TEST_WORKER_START_DELAY_S", "600")
    monkeypatch.setenv("DRTRITON_TEST_MARKER", marker)
    server = ServerProcess(*server_args(2), "--host", "0.0.0.0", "--insecure")
    try:
        wait_until(lambda: len(_workers(server.pid)) == 2, 120, "the workers to start")
        assert any("WARNING: --insecure" in line for line in server.stderr), server.stderr
        started = list(_workers(server.pid))
        server.proc.send_signal(signal.SIGINT)
        stopped_at = time.monotonic()
        code = server.wait_exit(15)
        took = time.monotonic() - stopped_at
    except BaseException:
        server.kill()
        raise
    assert code == 0, "".join(server.stderr)
    assert took < 15
    assert server.stdout == [], "it never listened"
    left = [p for p in started if _alive(p)] + _marked(marker)
    assert not left, f"left behind: {left}"


def _workers(pid: int) -> list[psutil.Process]:
    found = []
    try:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if "sandbox.worker" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
    except psutil.Error:
        return []
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes (other than this one) whose environment carries the test's marker."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get("DRTRITON_TEST_MARKER") == marker and _alive(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_peer_host_drops_the_port() -> None:
    assert peer_host("ipv4:10.0.0.7:54321") == "10.0.0.7"
    assert peer_host("ipv6:[::1]:54321") == "::1"
    assert peer_host("unix:/tmp/s") == "unix:/tmp/s"
