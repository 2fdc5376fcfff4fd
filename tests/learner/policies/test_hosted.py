"""The OpenAI-compatible policy against a scripted local server: answers, retries, failures."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from learner.policies.base import Policy, PolicyError
from learner.policies.hosted import (
    HostedPolicy,
    RateLimiter,
    backoff_delay,
    completions_url,
    parse_choices,
    parse_retry_after,
)
from synth.teacher.prompt import build_prompt
from tests.learner.policies.fake_openai import FakeServer, problem, serve

KEY_ENV = "DRTRITON_TEST_HOSTED_KEY"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local server is reached directly, whatever proxy the environment names."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with serve() as fake:
        yield fake


def make_policy(url: str, sleeps: list[float] | None = None, **options: Any) -> HostedPolicy:
    """A policy whose backoff waits are recorded instead of slept."""
    recorded = sleeps if sleeps is not None else []
    options = {"max_retries": 2, "timeout_s": 10.0, "api_key_env": KEY_ENV, **options}
    return HostedPolicy(url, "test-model", sleep=recorded.append, **options)


def codes(answers: list[Any]) -> list[str | None]:
    return [a.code for a in answers]


def test_good_answers_in_problem_order_with_the_shared_prompt(server: FakeServer) -> None:
    problems = [problem("good", i) for i in range(5)]
    policy = make_policy(server.url, temperature=0.7, max_new_tokens=333)
    assert isinstance(policy, Policy)
    answers = policy.propose(problems, samples=2, seed=3)
    assert [len(a) for a in answers] == [2] * 5
    for i, pair in enumerate(answers):
        assert all(f"case_good_{i} " in (a.code or "") for a in pair)
        assert all(a.error is None and not a.truncated and a.tokens == 12 for a in pair)
        assert pair[0].code != pair[1].code  # two choices of one call
    payload = server.payloads[0]
    assert payload["model"] == "test-model"
    assert payload["n"] == 2 and payload["max_tokens"] == 333 and payload["temperature"] == 0.7
    assert payload["messages"][-1]["content"] in {build_prompt(p) for p in problems}
    assert sum(server.calls.values()) == 5  # n honoured: one call per problem


def test_same_seed_sends_the_same_seeds(server: FakeServer) -> None:
    policy = make_policy(server.url)
    first = policy.propose([problem("good", 0), problem("good", 1)], seed=7)
    again = policy.propose([problem("good", 0), problem("good", 1)], seed=7)
    other = policy.propose([problem("good", 0), problem("good", 1)], seed=8)
    assert codes(first[0] + first[1]) == codes(again[0] + again[1])
    assert codes(first[0]) != codes(other[0])


def test_bad_json_and_rate_limit_lose_nothing(server: FakeServer) -> None:
    sleeps: list[float] = []
    policy = make_policy(server.url, sleeps, max_retries=2)
    problems = [problem("good", 0), problem("badjson"), problem("ratelimited"), problem("good", 1)]
    answers = policy.propose(problems, samples=2)
    assert [len(a) for a in answers] == [2, 2, 2, 2]
    good = [answers[0], answers[2], answers[3]]
    assert all(a.code is not None and a.error is None for pair in good for a in pair)
    assert all(a.code is None and "not JSON" in (a.error or "") for a in answers[1])
    assert server.calls["case_badjson_0"] == 3  # retried, then given up
    assert server.calls["case_ratelimited_0"] == 2
    assert 1.0 in sleeps  # Retry-After: 1 honoured


def test_a_time_out_is_retried_and_a_hang_becomes_an_error(server: FakeServer) -> None:
    policy = make_policy(server.url, timeout_s=1.5, max_retries=1)
    answers = policy.propose([problem("slow"), problem("hang"), problem("good")])
    assert answers[0][0].code is not None  # the second call answered
    assert server.calls["case_slow_0"] >= 2
    assert answers[1][0].code is None and "timed out" in (answers[1][0].error or "")
    assert answers[2][0].code is not None


def test_server_errors_are_retried_then_reported_per_problem(server: FakeServer) -> None:
    sleeps: list[float] = []
    policy = make_policy(server.url, sleeps, max_retries=3, backoff_s=0.5, max_backoff_s=2.0)
    answers = policy.propose([problem("broken"), problem("refused"), problem("good")], samples=2)
    assert all("HTTP 500" in (a.error or "") for a in answers[0])
    assert server.calls["case_broken_0"] == 4
    assert all("maximum context length" in (a.error or "") for a in answers[1])
    assert server.calls["case_refused_0"] == 2  # asked once more without n, not retried
    assert policy.send_n  # the 400 was not about n
    assert all(a.code is not None for a in answers[2])
    assert len(sleeps) == 3 and all(0.25 <= s <= 2.0 for s in sleeps)


def test_truncated_answers(server: FakeServer) -> None:
    answers = make_policy(server.url).propose([problem("truncated"), problem("cutopen")])
    closed, cut = answers[0][0], answers[1][0]
    assert closed.truncated and closed.code is not None  # the block closed before the cut
    assert cut.truncated and cut.code is None and "max_new_tokens" in (cut.error or "")


def test_a_server_ignoring_n_is_asked_again(server: FakeServer) -> None:
    server.ignore_n = True
    answers = make_policy(server.url).propose([problem("good", 0), problem("good", 1)], samples=3)
    assert [len(a) for a in answers] == [3, 3]
    assert server.calls["case_good_0"] == 3
    assert len(set(codes(answers[0]))) == 3  # each call its own seed


def test_a_server_refusing_n_gets_one_sample_per_call(server: FakeServer) -> None:
    server.reject_n = True
    policy = make_policy(server.url, concurrency=1)
    answers = policy.propose([problem("good", 0), problem("good", 1)], samples=3)
    assert all(a.code is not None for pair in answers for a in pair)
    assert [len(a) for a in answers] == [3, 3]
    assert not policy.send_n
    assert sum(server.calls.values()) == 1 + 6  # one refusal, then one call per sample


def test_auth_failure_is_a_policy_error_and_the_key_stays_secret(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.key = "right-key"
    with pytest.raises(PolicyError, match=KEY_ENV) as missing:
        make_policy(server.url).propose([problem("good", i) for i in range(6)])
    assert "401" in str(missing.value)
    monkeypatch.setenv(KEY_ENV, "wrong-key-123")
    policy = make_policy(server.url)
    before = sum(server.calls.values())
    with pytest.raises(PolicyError) as wrong:
        policy.propose([problem("good")])
    assert sum(server.calls.values()) == before + 1  # no retries on 401
    assert "wrong-key-123" not in str(wrong.value) + repr(policy)
    assert "***" in str(wrong.value)  # the server echoed the key; it was masked
    monkeypatch.setenv(KEY_ENV, "right-key")
    answers = make_policy(server.url).propose([problem("good")])
    assert answers[0][0].code is not None
    assert server.headers[-1]["authorization"] == "Bearer right-key"


def test_unreachable_server_and_wrong_model_path(server: FakeServer) -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(PolicyError, match="cannot reach"):
        make_policy(f"http://127.0.0.1:{port}/v1").propose([problem("good")])
    with pytest.raises(PolicyError, match="404"):
        make_policy(server.url.removesuffix("/v1")).propose([problem("good")])
    with pytest.raises(PolicyError, match="base URL"):
        HostedPolicy("ftp://example/v1", "m")


def test_concurrency_is_bounded(server: FakeServer) -> None:
    server.delay_s = 0.05
    answers = make_policy(server.url, concurrency=2).propose([problem("good", i) for i in range(8)])
    assert all(pair[0].code is not None for pair in answers)
    assert 1 <= server.max_in_flight <= 2


def test_rate_limiter_spaces_requests() -> None:
    now, sleeps = [0.0], []
    limiter = RateLimiter(4.0, clock=lambda: now[0], sleep=sleeps.append)
    for _ in range(3):
        limiter.wait()
    assert sleeps == [0.25, 0.5]
    now[0] = 10.0
    limiter.wait()
    assert sleeps == [0.25, 0.5]  # a slot in the past costs no wait
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_pure_helpers() -> None:
    assert completions_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert completions_url("https://h/v1/chat/completions") == "https://h/v1/chat/completions"
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert backoff_delay(0, None, base=1.0, cap=60.0) == 1.0
    assert backoff_delay(3, None, base=1.0, cap=60.0, jitter=0.5) == 4.0
    assert backoff_delay(10, None, base=1.0, cap=60.0) == 60.0
    assert backoff_delay(5, 7.0, base=1.0, cap=60.0) == 7.0
    choices, tokens = parse_choices(
        b'{"choices": [{"index": 1, "message": {"content": [{"type": "text", "text": "b"}]}},'
        b'{"index": 0, "message": {"content": "a"}, "finish_reason": "stop"}]}'
    )
    assert choices == [("a", "stop"), ("b", None)] and tokens is None
    for bad in (b"[]", b'{"choices": []}', b'{"choices": [{"text": "x"}]}', b"\xff"):
        with pytest.raises(ValueError):
            parse_choices(bad)


def test_extra_body_and_system_prompt(server: FakeServer) -> None:
    policy = make_policy(
        server.url,
        extra_body={"max_tokens": None, "max_completion_tokens": 99, "stop": ["</triton_code>"]},
        system_prompt="Be exact.",
        send_seed=False,
    )
    assert policy.propose([problem("good")])[0][0].code is not None
    payload = server.payloads[-1]
    assert "max_tokens" not in payload and "seed" not in payload
    assert payload["max_completion_tokens"] == 99 and payload["stop"] == ["</triton_code>"]
    assert payload["messages"][0] == {"role": "system", "content": "Be exact."}
