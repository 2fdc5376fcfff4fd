"""The gRPC server: a real `drtriton sandbox serve` on loopback, plus the translation layer
in-process over a scripted runner (error mapping, deadlines, health watchers)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.metadata
import os
import signal
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from protos.drtriton.sandbox.v1 import sandbox_pb2_grpc
from sandbox.client import SandboxClient, SandboxUnavailableError
from sandbox.config import MAX_TRIALS
from sandbox.result import VerifyResult
from sandbox.server import SERVICE_NAME
from tests.sandbox.conftest import (
    GOOD_RELU,
    HANGING,
    RELU_PROBLEM,
    SLOW_GOOD_RELU,
    SYNTAX_ERROR,
    WRONG_RELU,
    ServerProcess,
    server_args,
    wait_until,
)
from tests.sandbox.scripted_server import InProcessServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def request(candidate: str, request_id: str = "", **options: object) -> pb.VerifyRequest:
    return pb.VerifyRequest(
        request_id=request_id,
        problem=RELU_PROBLEM,
        candidate=candidate,
        options=pb.VerifyOptions(timing=False, **options),
    )


@pytest.fixture(scope="module")
def channel(sandbox_server: str) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(sandbox_server) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> sandbox_pb2_grpc.SandboxStub:
    return sandbox_pb2_grpc.SandboxStub(channel)


def health_status(channel: grpc.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


# -- a real server ----------------------------------------------------------------------------


def test_health_is_serving(channel: grpc.Channel) -> None:
    assert health_status(channel) == SERVING
    assert health_status(channel, SERVICE_NAME) == SERVING


def test_reflection_lists_the_services(channel: grpc.Channel) -> None:
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= services
    described = db.FindFileContainingSymbol(SERVICE_NAME)
    assert described.package == "drtriton.sandbox.v1"
    assert [s.name for s in described.service] == ["Sandbox"]


def test_get_info_describes_the_server(stub: sandbox_pb2_grpc.SandboxStub) -> None:
    info = stub.GetInfo(pb.GetInfoRequest(), timeout=10)
    assert info.mode == "cpu"
    assert info.workers == 2
    assert info.queue_capacity > 0
    assert 0 <= info.busy_workers <= 2
    assert info.serving
    assert info.isolation, "isolation features are reported"
    assert info.weak_isolation_accepted == (os.environ.get("DRTRITON_TEST_WEAK_ISOLATION") == "1")
    prov = info.provenance
    assert prov.device == "cpu" and prov.interpreter
    assert prov.torch_version == importlib.metadata.version("torch")
    assert prov.triton_version == importlib.metadata.version("triton")
    assert prov.hostname


@pytest.mark.parametrize(
    "bad",
    [
        pb.VerifyRequest(problem="", candidate=GOOD_RELU),
        pb.VerifyRequest(problem=RELU_PROBLEM, candidate="   \n"),
        pb.VerifyRequest(
            problem=RELU_PROBLEM,
            candidate=GOOD_RELU,
            options=pb.VerifyOptions(trials=MAX_TRIALS + 1),
        ),
        pb.VerifyRequest(
            problem=RELU_PROBLEM, candidate=GOOD_RELU, options=pb.VerifyOptions(atol=-1.0)
        ),
        pb.VerifyRequest(problem=RELU_PROBLEM, candidate=GOOD_RELU, format=99),
    ],
    ids=["empty-problem", "blank-candidate", "too-many-trials", "negative-atol", "unknown-format"],
)
def test_malformed_requests_are_invalid_argument(
    stub: sandbox_pb2_grpc.SandboxStub, bad: pb.VerifyRequest
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Verify(bad, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details()


def test_a_bad_kernel_is_an_ok_response(stub: sandbox_pb2_grpc.SandboxStub) -> None:
    response = stub.Verify(request(WRONG_RELU, "wrong"), timeout=120)
    assert response.request_id == "wrong"
    assert response.verdict == pb.WRONG_OUTPUT, response.message


def test_verify_stream_answers_by_request_id_out_of_order(
    stub: sandbox_pb2_grpc.SandboxStub,
) -> None:
    # Two workers: the hanging job holds one for its whole budget while the syntax
    # error passes through the other, so its answer must come first.
    items = [
        request(HANGING, "slow", time_budget_s=8),
        request(SYNTAX_ERROR, "fast"),
        request(GOOD_RELU, "good"),
    ]
    responses = list(stub.VerifyStream(iter(items), timeout=120))
    order = [r.request_id for r in responses]
    assert sorted(order) == ["fast", "good", "slow"], order
    assert order.index("fast") < order.index("slow"), f"answers waited for the slow job: {order}"
    verdicts = {r.request_id: pb.Verdict.Name(r.verdict) for r in responses}
    assert verdicts == {"slow": "TIMEOUT", "fast": "SYNTAX_ERROR", "good": "CORRECT"}, [
        (r.request_id, r.message) for r in responses
    ]


def test_client_deadline_bounds_the_job(
    stub: sandbox_pb2_grpc.SandboxStub, channel: grpc.Channel
) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        stub.Verify(request(HANGING, "abandoned", time_budget_s=300), timeout=3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 6
    # The server ends the job at the deadline rather than at its 300 s budget.
    wait_until(
        lambda: stub.GetInfo(pb.GetInfoRequest(), timeout=10).busy_workers == 0,
        30,
        "the abandoned job to be killed",
    )
    assert health_status(channel) == SERVING
    assert stub.Verify(request(GOOD_RELU), timeout=120).verdict == pb.CORRECT


def missing_isolation(target: str) -> list[str]:
    with SandboxClient(target) as client:
        return [f.name for f in client.info().isolation if not f.available]


@pytest.fixture(scope="module")
def small_server(sandbox_server: str) -> Iterator[ServerProcess]:
    """`--workers 1 --queue 1`; started without --allow-weak-isolation where the host
    offers every isolation feature. The drain test stops it (it comes last)."""
    args = server_args(1, 1)
    if not missing_isolation(sandbox_server) and "--allow-weak-isolation" in args:
        args.remove("--allow-weak-isolation")
    server = ServerProcess(*args)
    try:
        server.wait_listening()
        yield server
    finally:
        if server.proc.poll() is None:
            code = server.terminate()
            assert code == 0, "".join(server.stderr)


def test_weak_isolation_needs_the_flag(sandbox_server: str, small_server: ServerProcess) -> None:
    missing = missing_isolation(sandbox_server)
    if not missing:
        # Nothing missing: the small server runs without the flag, and says so.
        info = SandboxClient(small_server.target).info()
        assert not info.weak_isolation_accepted and info.serving
        assert info.isolation and all(f.available for f in info.isolation)
        return
    args = [a for a in server_args(1) if a != "--allow-weak-isolation"]
    server = ServerProcess(*args)
    try:
        assert server.first_line() is None, "served despite missing isolation"
        assert server.wait_exit() == 2
        lines = [line for line in server.stderr if line.strip()]
        assert len(lines) == 1, lines
        assert lines[0].startswith("drtriton: error:")
        assert "--allow-weak-isolation" in lines[0]
        for name in missing:
            assert name in lines[0]
    finally:
        if server.proc.poll() is None:
            server.kill()


def test_full_queue_is_resource_exhausted_and_the_server_keeps_serving(
    small_server: ServerProcess,
) -> None:
    with grpc.insecure_channel(small_server.target) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        # One worker and one queue place: of six simultaneous slow jobs, two fit.
        calls = [
            stub.Verify.future(request(HANGING, f"h{i}", time_budget_s=3), timeout=120)
            for i in range(6)
        ]
        # The check below must come after the slow jobs filled the worker and the queue.
        wait_until(
            lambda: (
                (info := stub.GetInfo(pb.GetInfoRequest(), timeout=10)).busy_workers == 1
                and info.queue_depth == 1
            ),
            60,
            "the worker and the queue to fill",
        )
        with (
            SandboxClient(small_server.target, max_retries=0) as client,
            pytest.raises(SandboxUnavailableError) as busy,
        ):
            client.verify(RELU_PROBLEM, GOOD_RELU, timing=False)
        assert busy.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        accepted, rejected = [], []
        for call in calls:
            try:
                accepted.append(call.result())
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                rejected.append(err)
        assert len(accepted) == 2 and len(rejected) == 4
        assert all(r.verdict == pb.TIMEOUT for r in accepted)
        assert health_status(channel) == SERVING
        assert stub.Verify(request(GOOD_RELU), timeout=120).verdict == pb.CORRECT


def test_sigterm_drains_in_flight_jobs(small_server: ServerProcess) -> None:
    with grpc.insecure_channel(small_server.target) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        in_flight = stub.Verify.future(request(SLOW_GOOD_RELU, "in-flight"), timeout=120)
        wait_until(
            lambda: stub.GetInfo(pb.GetInfoRequest(), timeout=10).busy_workers == 1,
            60,
            "the job to start",
        )
        small_server.proc.terminate()  # SIGTERM
        wait_until(lambda: health_status(channel) == NOT_SERVING, 30, "NOT_SERVING")
        with pytest.raises(grpc.RpcError) as caught:
            stub.Verify(request(GOOD_RELU, "late"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        answer = in_flight.result()
        assert answer.request_id == "in-flight"
        assert answer.verdict == pb.CORRECT, answer.message
    assert small_server.wait_exit() == 0, "".join(small_server.stderr)


def test_a_second_signal_stops_at_once_without_a_traceback() -> None:
    """Signalled again while draining, the server stops now: the jobs it cut short are
    UNAVAILABLE to their clients (retried elsewhere), an open health watch ends the same
    way, and stderr says so in one line, with no traceback of the calls it cancelled."""
    server = ServerProcess(*server_args(1))
    try:
        server.wait_listening()
        _stop_twice(server)
    except BaseException:
        server.kill()
        raise
    stderr = "".join(server.stderr)
    assert "stopped without draining" in stderr
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr


def _stop_twice(server: ServerProcess) -> None:
    """Two jobs in flight and a health watch open, then two SIGTERMs."""
    with grpc.insecure_channel(server.target) as channel:
        stub = sandbox_pb2_grpc.SandboxStub(channel)
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=120
        )
        assert next(watch).status == SERVING
        jobs = [
            stub.Verify.future(request(SLOW_GOOD_RELU, f"job-{i}"), timeout=120) for i in range(2)
        ]
        wait_until(
            lambda: stub.GetInfo(pb.GetInfoRequest(), timeout=10).busy_workers == 1,
            60,
            "a job to start",
        )
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: any("draining" in line for line in server.stderr), 30, "draining")
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait_exit() == 130
        for job in jobs:
            with pytest.raises(grpc.RpcError) as caught:
                job.result()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError):
            list(watch)


# -- the translation layer over a scripted runner ---------------------------------------------


@pytest.fixture
def scripted() -> Iterator[InProcessServer]:
    server = InProcessServer()
    yield server
    server.close()


def fake(candidate: str, request_id: str = "") -> pb.VerifyRequest:
    return pb.VerifyRequest(request_id=request_id, problem="p", candidate=candidate)


@pytest.mark.parametrize(
    ("candidate", "code"),
    [
        ("invalid", grpc.StatusCode.INVALID_ARGUMENT),
        ("full", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("draining", grpc.StatusCode.UNAVAILABLE),
        ("lost", grpc.StatusCode.UNAVAILABLE),
        ("bug", grpc.StatusCode.INTERNAL),
    ],
)
def test_runner_errors_become_status_codes(
    scripted: InProcessServer, candidate: str, code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        scripted.stub.Verify(fake(candidate), timeout=10)
    assert caught.value.code() == code


def test_the_deadline_reaches_the_runner(scripted: InProcessServer) -> None:
    answer = scripted.stub.Verify(fake("ok", "id-7"), timeout=20)
    assert answer.request_id == "id-7" and answer.verdict == pb.CORRECT
    scripted.stub.Verify(fake("ok"))
    with_deadline, without = scripted.runner.timeouts
    # The server reads the remaining time off its own clock: allow it a little skew.
    assert with_deadline is not None and 15 < with_deadline <= 20.5
    assert without is None


def test_a_timeout_forced_by_the_deadline_is_not_a_verdict(scripted: InProcessServer) -> None:
    own_budget = pb.VerifyRequest(
        problem="p", candidate="timeout", options=pb.VerifyOptions(time_budget_s=0.3)
    )
    assert scripted.stub.Verify(own_budget, timeout=20).verdict == pb.TIMEOUT
    with pytest.raises(grpc.RpcError) as caught:
        scripted.stub.Verify(fake("timeout"), timeout=1.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_stream_item_errors_do_not_end_the_stream(scripted: InProcessServer) -> None:
    items = [
        fake("sleep:0.5", "slow"),
        fake("full", "full"),
        fake("invalid", "bad"),
        fake("ok", "ok"),
    ]
    items.append(fake("ok"))  # no id: keyed by its position
    answers = {r.request_id: r for r in scripted.stub.VerifyStream(iter(items), timeout=20)}
    assert set(answers) == {"slow", "full", "bad", "ok", "4"}
    assert answers["slow"].verdict == pb.CORRECT and answers["ok"].verdict == pb.CORRECT
    assert answers["full"].verdict == pb.SANDBOX_ERROR
    assert answers["full"].message.startswith("RESOURCE_EXHAUSTED:")
    assert answers["bad"].verdict == pb.SANDBOX_ERROR
    assert answers["bad"].message.startswith("INVALID_ARGUMENT:")


def test_every_health_watcher_sees_a_change(scripted: InProcessServer) -> None:
    health = health_pb2_grpc.HealthStub(scripted.channel)
    watch = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
    leaving = health.Watch(watch, timeout=15)
    staying = health.Watch(watch, timeout=15)
    assert next(leaving).status == SERVING
    assert next(staying).status == SERVING
    leaving.cancel()  # one client goes away; the other must still hear of changes
    scripted.runner.healthy = False
    assert next(staying).status == NOT_SERVING
    info = scripted.stub.GetInfo(pb.GetInfoRequest(), timeout=10)
    assert not info.serving
    staying.cancel()


def test_drain_refuses_new_jobs_and_finishes_old_ones(scripted: InProcessServer) -> None:
    in_flight = scripted.stub.Verify.future(fake("wait", "old"), timeout=20)
    wait_until(lambda: len(scripted.runner.timeouts) == 1, 10, "the job to reach the runner")
    scripted.call(scripted.server.drain())
    assert scripted.runner.drained
    health = health_pb2_grpc.HealthStub(scripted.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == NOT_SERVING
    with pytest.raises(grpc.RpcError) as caught:
        scripted.stub.Verify(fake("ok", "new"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(scripted.runner.timeouts) == 1, "a draining server passes no new job on"
    scripted.loop.call_soon_threadsafe(scripted.runner.release.set)
    assert in_flight.result(timeout=10).request_id == "old"


def test_abandoned_job_keeps_running_until_the_runner_answers(scripted: InProcessServer) -> None:
    """A cancelled call must not cancel the runner's job (it owns a worker until it ends)."""
    seen: concurrent.futures.Future[bool] = concurrent.futures.Future()
    original = scripted.runner.verify

    async def tracking(request: pb.VerifyRequest, timeout_s: float | None = None) -> VerifyResult:
        try:
            return await original(request, timeout_s)
        except asyncio.CancelledError:
            seen.set_result(False)
            raise
        finally:
            if not seen.done():
                seen.set_result(True)

    scripted.runner.verify = tracking  # type: ignore[method-assign]
    with pytest.raises(grpc.RpcError) as caught:
        scripted.stub.Verify(fake("sleep:1.5"), timeout=0.5)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert seen.result(timeout=10) is True, "the runner's job was cancelled"


def test_a_candidates_unencodable_message_is_still_its_own_verdict(
    stub: sandbox_pb2_grpc.SandboxStub,
) -> None:
    """A lone surrogate in the candidate's error (JSON's `\\udc80` escape) must not fail the
    answer: an INTERNAL or sandbox_error would be masked by learners, so a policy could
    learn to dodge its negative rewards that way."""
    failing = GOOD_RELU.replace(
        "    return", "    assert tensor_0.numel() < 0, '\\udc80 lone'\n    return", 1
    )
    assert "\\udc80" in failing
    reply = stub.Verify(request(failing, "surrogate"), timeout=120)
    assert reply.verdict == pb.RUNTIME_ERROR, reply
    assert "\ufffd" in reply.message or "lone" in reply.message


def test_an_unknown_health_service_is_not_echoed_back_whole(channel: grpc.Channel) -> None:
    """Health needs no token: its answer must not grow with what a caller sends."""
    stub = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Check(health_pb2.HealthCheckRequest(service="\x00" * 100_000), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(refused.value.details()) < 1000  # not the 100,000 characters sent
