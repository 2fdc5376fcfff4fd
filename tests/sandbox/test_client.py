"""The client: addresses, retries and their limits, infrastructure errors vs verdicts."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.client import (
    SERVICE_NAME,
    AsyncSandboxClient,
    SandboxClient,
    SandboxInvalidRequestError,
    SandboxRpcError,
    SandboxTimeoutError,
    SandboxUnavailableError,
    backoff_delay,
    build_request,
    channel_target,
)
from sandbox.errors import InvalidRequestError, SandboxInfrastructureError
from tests.sandbox.conftest import (
    CRASHING,
    GOOD_RELU,
    HANGING,
    NO_ENTRY_POINT,
    RELU_PROBLEM,
    REPO_ROOT,
    SYNTAX_ERROR,
    WRONG_RELU,
    free_port,
    running_server,
)

FAST = {"backoff_base_s": 0.01, "backoff_max_s": 0.05}

# -- addresses and requests ------------------------------------------------------------------


def test_channel_target_forms() -> None:
    assert channel_target("10.0.0.1:50051") == "10.0.0.1:50051"
    assert channel_target(["10.0.0.1:50051"]) == "10.0.0.1:50051"
    assert channel_target("dns:///sandbox.internal:50051") == "dns:///sandbox.internal:50051"
    assert channel_target(["10.0.0.1:1", "10.0.0.2:2"]) == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target("10.0.0.1:1, 10.0.0.2:2") == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target(["[::1]:1", "[fe80::2]:2"]) == "ipv6:[::1]:1,[fe80::2]:2"
    assert channel_target(["localhost:1", "127.0.0.2:2"]) == "ipv4:127.0.0.1:1,127.0.0.2:2"
    with pytest.raises(ValueError, match="mix"):
        channel_target(["10.0.0.1:1", "[::1]:2"])
    with pytest.raises(ValueError, match="HOST:PORT"):
        channel_target(["10.0.0.1", "10.0.0.2:2"])
    with pytest.raises(ValueError):
        channel_target([])


def test_build_request_sets_only_given_options(tmp_path) -> None:  # noqa: ANN001
    request = build_request("p", "c", trials=7, timing=False, seed=3, format="kernelbench")
    assert request.options.trials == 7 and not request.options.timing
    assert request.options.seed == 3 and request.format == pb.FORMAT_KERNELBENCH
    assert not request.options.HasField("atol") and not request.options.HasField("rtol")
    assert request.request_id
    path = tmp_path / "candidate.py"
    path.write_text("source")
    assert build_request("p", path, atol=0.5).candidate == "source"
    with pytest.raises(ValueError):
        build_request("p", "c", format="onnx")


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    for attempt in range(8):
        cap = min(4.0, 0.5 * 2**attempt)
        delays = [backoff_delay(attempt, 0.5, 4.0) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays)
        assert len(set(delays)) > 1


def test_error_classes_say_whose_fault() -> None:
    assert issubclass(SandboxUnavailableError, SandboxInfrastructureError)
    assert issubclass(SandboxTimeoutError, SandboxInfrastructureError)
    assert issubclass(SandboxInvalidRequestError, SandboxInfrastructureError)
    assert issubclass(SandboxInvalidRequestError, InvalidRequestError)


def test_importing_the_client_imports_neither_torch_nor_triton() -> None:
    """A learner host imports the client; torch and Triton are the sandbox host's."""
    check = (
        "import sys, sandbox.client; "
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=True,
    )
    assert proc.stdout.strip() == "[]", proc.stdout


# -- retries against a scripted server ---------------------------------------------------------


class ScriptedSandbox(sandbox_pb2_grpc.SandboxServicer):
    """Answers Verify with the next status code of a script, then OK for ever."""

    def __init__(self, script: list[grpc.StatusCode]) -> None:
        self.script = list(script)
        self.calls = 0
        self.lock = threading.Lock()
        self.authorization: list[str] = []

    def Verify(self, request: pb.VerifyRequest, context: grpc.ServicerContext) -> pb.VerifyResponse:  # noqa: N802
        with self.lock:
            self.calls += 1
            self.authorization += [
                v for k, v in context.invocation_metadata() if k == "authorization"
            ]
            code = self.script.pop(0) if self.script else grpc.StatusCode.OK
        if request.candidate.startswith("always:"):
            code = grpc.StatusCode[request.candidate.split(":", 1)[1]]
        if code != grpc.StatusCode.OK:
            context.abort(code, f"scripted {code.name}")
        return pb.VerifyResponse(
            request_id=request.request_id, verdict=pb.WRONG_OUTPUT, message=request.candidate
        )


def start_scripted(
    status: int = health_pb2.HealthCheckResponse.SERVING,
) -> tuple[ScriptedSandbox, str, grpc.Server]:
    servicer = ScriptedSandbox([])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    sandbox_pb2_grpc.add_SandboxServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set(SERVICE_NAME, status)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return servicer, f"127.0.0.1:{port}", server


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedSandbox, str]]:
    servicer, target, server = start_scripted()
    yield servicer, target
    server.stop(0)


def test_a_fleet_shares_the_calls_and_skips_servers_not_serving() -> None:
    fleet = [start_scripted() for _ in range(2)]
    sick, sick_target, sick_server = start_scripted(health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        targets = [target for _, target, _ in fleet] + [sick_target]
        with SandboxClient(targets, max_retries=0) as client:
            assert client.target.startswith("ipv4:")
            results = client.verify_many([("p", str(i)) for i in range(20)], concurrency=1)
        assert all(r.verdict == "wrong_output" for r in results), [r.message for r in results]
        calls = [servicer.calls for servicer, _, _ in fleet]
        assert sum(calls) == 20 and min(calls) >= 5, calls
        assert sick.calls == 0
    finally:
        for _, _, server in [*fleet, (sick, sick_target, sick_server)]:
            server.stop(0)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_retries_unavailable_and_resource_exhausted(scripted, code: grpc.StatusCode) -> None:  # noqa: ANN001
    servicer, target = scripted
    servicer.script = [code, code]
    retries: list[tuple[int, grpc.StatusCode, float]] = []
    with SandboxClient(
        target, max_retries=4, on_retry=lambda *r: retries.append(r), **FAST
    ) as client:
        result = client.verify("p", "kernel")
    assert result.verdict == "wrong_output", "a bad kernel is a result, not an exception"
    assert servicer.calls == 3
    assert [(n, c) for n, c, _ in retries] == [(1, code), (2, code)]


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, SandboxInvalidRequestError),
        (grpc.StatusCode.INTERNAL, SandboxRpcError),
        (grpc.StatusCode.PERMISSION_DENIED, SandboxRpcError),
    ],
)
def test_no_retry_on_other_codes(scripted, code: grpc.StatusCode, error: type) -> None:  # noqa: ANN001
    servicer, target = scripted
    with SandboxClient(target, max_retries=4, **FAST) as client, pytest.raises(error) as caught:
        client.verify("p", f"always:{code.name}")
    assert servicer.calls == 1
    assert caught.value.code == code
    assert isinstance(caught.value, SandboxInfrastructureError)


def test_gives_up_after_max_retries(scripted) -> None:  # noqa: ANN001
    servicer, target = scripted
    with SandboxClient(target, max_retries=2, **FAST) as client:
        with pytest.raises(SandboxUnavailableError) as caught:
            client.verify("p", "always:RESOURCE_EXHAUSTED")
        assert servicer.calls == 3 and caught.value.attempts == 3
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_verify_many_keeps_order_and_reports_unjudged_items(scripted) -> None:  # noqa: ANN001
    _, target = scripted
    items = [
        ("p", "first"),
        {"problem": "p", "candidate": "always:UNAVAILABLE"},
        ("p", "always:INVALID_ARGUMENT", {"trials": 2}),
        ("p", "last"),
    ]
    with SandboxClient(target, max_retries=1, **FAST) as client:
        results = client.verify_many(items, concurrency=4)
    assert [r.verdict for r in results] == [
        "wrong_output",
        "sandbox_error",
        "sandbox_error",
        "wrong_output",
    ]
    assert results[0].message == "first" and results[3].message == "last"
    assert results[1].message.startswith("UNAVAILABLE:")
    assert results[2].message.startswith("INVALID_ARGUMENT:")


def test_async_client_retries_and_keeps_order(scripted) -> None:  # noqa: ANN001
    servicer, target = scripted
    servicer.script = [grpc.StatusCode.UNAVAILABLE]

    async def main() -> list[str]:
        async with AsyncSandboxClient(target, max_retries=2, **FAST) as client:
            one = await client.verify("p", "solo")
            many = await client.verify_many(
                [("p", str(i)) for i in range(10)] + [("p", "always:RESOURCE_EXHAUSTED")],
                concurrency=3,
            )
            assert await client.health()
            return [one.message] + [r.message for r in many]

    messages = asyncio.run(main())
    assert messages[:11] == ["solo"] + [str(i) for i in range(10)]
    assert messages[11].startswith("RESOURCE_EXHAUSTED:")


def test_both_clients_send_the_token_from_the_environment(scripted, monkeypatch) -> None:  # noqa: ANN001
    servicer, target = scripted
    monkeypatch.setenv("DRTRITON_SANDBOX_TOKEN", "from-the-environment")
    with SandboxClient(target) as client:
        client.verify("p", "sync")

    async def main() -> None:
        async with AsyncSandboxClient(target, token="given-explicitly") as client:
            await client.verify("p", "async")

    asyncio.run(main())
    monkeypatch.delenv("DRTRITON_SANDBOX_TOKEN")
    with SandboxClient(target) as client:
        client.verify("p", "none")
    assert servicer.authorization == ["Bearer from-the-environment", "Bearer given-explicitly"]


def test_unreachable_server_is_an_infrastructure_error() -> None:
    target = f"127.0.0.1:{free_port()}"
    with SandboxClient(target, timeout_s=10, max_retries=1, **FAST) as client:
        assert not client.health(timeout_s=2)
        with pytest.raises(SandboxUnavailableError):
            client.verify("p", "c")
        [result] = client.verify_many([("p", "c")])
    assert result.verdict == "sandbox_error" and result.infrastructure_failure


# -- a real server ------------------------------------------------------------------------------


def test_verdicts_through_the_client(sandbox_client: SandboxClient) -> None:
    assert sandbox_client.health()
    cases = {
        "correct": GOOD_RELU,
        "wrong_output": WRONG_RELU,
        "runtime_error": CRASHING,
        "syntax_error": SYNTAX_ERROR,
        "no_entry_point": NO_ENTRY_POINT,
    }
    results = sandbox_client.verify_many(
        [{"problem": RELU_PROBLEM, "candidate": c, "timing": False} for c in cases.values()],
        concurrency=4,
    )
    assert [r.verdict for r in results] == list(cases), [r.message for r in results]
    good = results[0]
    assert len(good.trials) == 5 and all(t.passed for t in good.trials)
    assert good.kernel_launches > 0
    assert good.candidate_ms is None, "no timing on CPU"
    assert good.provenance["device"] == "cpu"


def test_client_deadline_raises_timeout(sandbox_client: SandboxClient) -> None:
    with pytest.raises(SandboxTimeoutError):
        sandbox_client.verify(RELU_PROBLEM, HANGING, time_budget_s=300, timeout_s=2)
    assert sandbox_client.health()


def test_retries_until_a_late_server_is_up() -> None:
    """The first attempts find nobody listening; the server starts after the first retry."""
    port = free_port()
    first_retry = threading.Event()
    codes: list[grpc.StatusCode] = []

    def on_retry(attempt: int, code: grpc.StatusCode, delay: float) -> None:
        codes.append(code)
        first_retry.set()

    outcome: dict[str, object] = {}
    with SandboxClient(
        f"127.0.0.1:{port}",
        timeout_s=240,
        max_retries=100,
        backoff_base_s=0.2,
        backoff_max_s=1.0,
        on_retry=on_retry,
    ) as client:

        def call() -> None:
            try:
                outcome["result"] = client.verify(RELU_PROBLEM, GOOD_RELU, timing=False)
            except Exception as err:  # noqa: BLE001 - reported below
                outcome["error"] = err

        caller = threading.Thread(target=call)
        caller.start()
        assert first_retry.wait(60), "the client never retried"
        with running_server(1, port=port):
            caller.join(240)
    assert "error" not in outcome, outcome
    assert outcome["result"].verdict == "correct"  # type: ignore[union-attr]
    assert codes and set(codes) == {grpc.StatusCode.UNAVAILABLE}
