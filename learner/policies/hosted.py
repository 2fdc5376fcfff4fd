"""A hosted model as a policy: any OpenAI-compatible `/v1/chat/completions` endpoint.

The prompt is the one our own policy sees (`synth.teacher.prompt.build_prompt`), sent as
one user message, so a hosted model is measured as a baseline on equal terms. Plain stdlib
HTTP (urllib): the API is one JSON POST, no SDK is needed.

What can go wrong, and what the caller sees:
- 401/403 (a missing or wrong key) and 404 (a wrong base URL or model name) would fail every
  problem alike: `PolicyError`, at once. So does a server never reached, after retries.
- 429, 5xx, time-outs, a lost connection and an unreadable answer are retried with
  exponential backoff (the wait a `Retry-After` header asks for, when there is one); when
  the retries are spent, that problem's answers are `Proposal`s with an `error` and the
  other problems keep theirs.
- A server that ignores `n` (one choice per call) is asked again for the rest; one that
  refuses `n` > 1 with a 400 is asked one sample per call from then on.

The key is read from the environment variable `api_key_env` only; it is never logged nor
put into an error message.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from learner.policies.base import PolicyError, Proposal

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
FATAL_STATUSES = {
    401: "the server refused the API key (HTTP 401); set {env} to a valid key",
    403: "the API key may not use this model (HTTP 403); check {env}",
    404: "no such endpoint or model (HTTP 404): check the base URL and the model name",
}
ERROR_TEXT_LIMIT = 300


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------


def completions_url(base_url: str) -> str:
    """The chat-completions URL of a base URL (`http://host:8000/v1`, as OpenAI's SDK takes
    it; a URL already ending in `/chat/completions` is kept)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PolicyError(f"hosted policy: {base_url!r} is not an http(s) base URL")
    url = base_url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a `Retry-After` header asks to wait (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def backoff_delay(
    attempt: int, retry_after: float | None, *, base: float, cap: float, jitter: float = 1.0
) -> float:
    """The wait before retry number `attempt` (0 = the first retry): what the server asked
    for, else base * 2^attempt scaled by `jitter` in [0.5, 1] (spreads concurrent retries);
    never more than `cap`."""
    if retry_after is not None:
        return min(retry_after, cap)
    return min(base * 2.0**attempt, cap) * jitter


def request_seed(seed: int, problem: str, call: int) -> int:
    """The `seed` sent with a problem's call number `call`: the same problem asked with the
    same seed sends the same seeds (a server that honours them answers alike)."""
    digest = hashlib.sha256(f"{seed}\n{call}\n{problem}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def message_text(message: Any) -> str:
    """A chat message's content as text (a string, or a list of text parts)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise ValueError(f"message content is a {type(content).__name__}")


def parse_choices(body: bytes) -> tuple[list[tuple[str, str | None]], int | None]:
    """(text, finish_reason) of each choice of a chat-completions answer and the answer's
    completion tokens; ValueError says what is wrong with an answer that is not one."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"the answer is not JSON ({err})") from None
    if not isinstance(data, Mapping):
        raise ValueError("the answer is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("the answer has no choices")
    if not all(isinstance(c, Mapping) and isinstance(c.get("message"), Mapping) for c in choices):
        raise ValueError("a choice has no message")
    if all(isinstance(c.get("index"), int) for c in choices):
        choices = sorted(choices, key=lambda c: c["index"])
    parsed = []
    for choice in choices:
        reason = choice.get("finish_reason")
        parsed.append(
            (message_text(choice["message"]), reason if isinstance(reason, str) else None)
        )
    usage = data.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, Mapping) else None
    return parsed, tokens if isinstance(tokens, int) else None


def proposal_from_choice(text: str, finish_reason: str | None, tokens: int) -> Proposal:
    """One choice as a Proposal. A choice cut at the token limit keeps its code only when the
    code block closed before the cut."""
    from synth.teacher.prompt import CLOSE_TAG, OPEN_TAG, extract_code

    truncated = finish_reason == "length"
    if truncated and CLOSE_TAG not in text[text.rfind(OPEN_TAG) :]:
        error = "the answer reached max_new_tokens before its code block closed"
        return Proposal(code=None, text=text, truncated=True, tokens=tokens, error=error)
    code = extract_code(text)
    error = None if code is not None else "the answer holds no <triton_code> block"
    return Proposal(code=code, text=text, truncated=truncated, tokens=tokens, error=error)


def server_message(body: bytes) -> str:
    """The error message of a failed call's body, short (OpenAI's `error.message` if any)."""
    text = body.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        error = data.get("error") if isinstance(data, Mapping) else None
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
    except json.JSONDecodeError:
        pass
    text = " ".join(text.split())
    return text[:ERROR_TEXT_LIMIT] + ("..." if len(text) > ERROR_TEXT_LIMIT else "")


# --------------------------------------------------------------------------------------------
# Rate limit
# --------------------------------------------------------------------------------------------


class RateLimiter:
    """At most `per_second` requests a second over every thread (None: no limit): each
    caller takes the next free slot, 1/per_second after the previous one."""

    def __init__(
        self,
        per_second: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if per_second is not None and per_second <= 0:
            raise ValueError(f"requests_per_second must be > 0, got {per_second}")
        self.interval = 0.0 if per_second is None else 1.0 / per_second
        self.clock, self.sleep = clock, sleep
        self._next = float("-inf")
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = self.clock()
            slot = max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            self.sleep(slot - now)


# --------------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Failure:
    """A call that gave no answer after its retries; `error` says why."""

    error: str


class _Aborted(Exception):
    """Another problem's call raised PolicyError: stop quietly."""


class HostedPolicy:
    """Candidates from an OpenAI-compatible chat-completions endpoint.

    `base_url` as OpenAI's SDK takes it (`https://api.openai.com/v1`, `http://host:8000/v1`),
    `model` the model's name there, the key from the environment variable `api_key_env`
    (no Authorization header when it is unset: local servers need none). `concurrency`
    problems are asked at once, at most `requests_per_second` calls a second in all.
    `extra_body` is merged into every request (e.g. `{"stop": ["</triton_code>"]}`); a key
    set to None there is left out (`{"max_tokens": None, "max_completion_tokens": 8192}`
    for models that want the newer name). A call's seed is sent unless `send_seed` is off.
    `sleep` and `clock` are for tests.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        *,
        max_new_tokens: int = 4096,
        temperature: float = 1.0,
        top_p: float = 1.0,
        timeout_s: float = 300.0,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        requests_per_second: float | None = None,
        concurrency: int = 4,
        with_example: bool = False,
        system_prompt: str | None = None,
        send_seed: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not model:
            raise PolicyError("hosted policy: no model name (spec hosted:BASE_URL#MODEL)")
        for label, value in (("max_new_tokens", max_new_tokens), ("concurrency", concurrency)):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        if max_retries < 0 or timeout_s <= 0:
            raise ValueError("max_retries must be >= 0 and timeout_s > 0")
        self.url = completions_url(base_url)
        self.name = f"hosted:{base_url}#{model}"
        self.model = model
        self.api_key_env = api_key_env
        self._api_key = os.environ.get(api_key_env) or None
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.concurrency = concurrency
        self.with_example, self.system_prompt = with_example, system_prompt
        self.send_seed = send_seed
        self.extra_body = dict(extra_body or {})
        self.sleep = sleep  # None: wait on the abort event, so an abort cuts a backoff short
        self.limiter = RateLimiter(requests_per_second, clock=clock, sleep=sleep or time.sleep)
        self.send_n = True  # off once the server refuses n > 1
        self.reached = False  # whether any HTTP answer came back yet
        self.requests = 0  # HTTP calls made, retries included
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:  # never the key
        return f"HostedPolicy({self.name!r}, key from ${self.api_key_env})"

    def propose(
        self, problems: Sequence[str], samples: int = 1, seed: int = 0
    ) -> list[list[Proposal]]:
        """`samples` answers per problem, in problem order; raises PolicyError when the
        endpoint cannot answer at all (key, URL, model, server down)."""
        if samples < 1:
            raise ValueError(f"samples must be at least 1, got {samples}")
        if not problems:
            return []
        abort = threading.Event()
        with ThreadPoolExecutor(min(self.concurrency, len(problems))) as pool:
            futures = [pool.submit(self._answer, p, samples, seed, abort) for p in problems]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                abort.set()
                for future in futures:
                    future.cancel()
                raise failed.exception()  # type: ignore[misc]
            return [future.result() for future in futures]

    # -- one problem ----------------------------------------------------------------------

    def _answer(
        self, problem: str, samples: int, seed: int, abort: threading.Event
    ) -> list[Proposal]:
        from synth.teacher.prompt import build_prompt

        messages = [
            {"role": "user", "content": build_prompt(problem, with_example=self.with_example)}
        ]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        answers: list[Proposal] = []
        for call in range(samples):  # each successful call brings at least one answer
            want = samples - len(answers)
            if want <= 0:
                break
            result = self._call(messages, want, request_seed(seed, problem, call), abort)
            if isinstance(result, _Failure):
                answers += [Proposal(code=None, error=result.error) for _ in range(want)]
                break
            choices, tokens = result
            per_choice = (tokens or 0) // len(choices)
            answers += [proposal_from_choice(t, r, per_choice) for t, r in choices[:want]]
        return answers

    def _payload(
        self, messages: list[dict[str, str]], n: int, seed: int, with_n: bool
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if n > 1 and with_n:
            payload["n"] = n
        if self.send_seed:
            payload["seed"] = seed
        return {k: v for k, v in {**payload, **self.extra_body}.items() if v is not None}

    def _call(
        self, messages: list[dict[str, str]], n: int, seed: int, abort: threading.Event
    ) -> tuple[list[tuple[str, str | None]], int | None] | _Failure:
        """One answered call (its choices), retrying what may pass on a second try."""
        error, unreachable, attempt, probing = "", False, 0, False
        while attempt <= self.max_retries:
            if abort.is_set():
                raise _Aborted
            payload = self._payload(messages, n, seed, self.send_n and not probing)
            self.limiter.wait()
            status, headers, body, problem = self._post(payload)
            retry_after = None
            if status is not None and 200 <= status < 300:
                try:
                    choices = parse_choices(body)
                    if probing:
                        self.send_n = False  # refused n > 1, took the same call without it
                    return choices
                except ValueError as err:
                    error, unreachable = f"bad response: {err}", False
            elif status in FATAL_STATUSES:
                message = FATAL_STATUSES[status].format(env=self.api_key_env)
                raise PolicyError(f"{self.name}: {message} ({self._clean(server_message(body))})")
            elif status == 400 and "n" in payload:
                probing = True  # the same call without n: is it n the server refuses?
                continue
            elif status is not None and status not in RETRY_STATUSES:
                return _Failure(f"HTTP {status}: {self._clean(server_message(body))}")
            elif status is not None:
                error, unreachable = f"HTTP {status}: {self._clean(server_message(body))}", False
                retry_after = parse_retry_after(headers.get("Retry-After"))
            else:
                error, unreachable = problem, problem.startswith("cannot reach")
            if attempt == self.max_retries:
                break
            delay = backoff_delay(
                attempt,
                retry_after,
                base=self.backoff_s,
                cap=self.max_backoff_s,
                jitter=random.uniform(0.5, 1.0),
            )
            (self.sleep or abort.wait)(delay)
            attempt += 1
        if unreachable and not self.reached:
            raise PolicyError(f"{self.name}: {error} (after {self.max_retries + 1} attempts)")
        return _Failure(f"{error} (after {attempt + 1} attempts)")

    def _post(self, payload: Mapping[str, Any]) -> tuple[int | None, Mapping[str, str], bytes, str]:
        """(status, headers, body, "") of one POST, or (None, {}, b"", why) when no HTTP
        answer came back."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(
            self.url, data=json.dumps(payload).encode(), headers=headers, method="POST"
        )
        with self._count_lock:
            self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
                self.reached = True
                return response.status, response.headers, body, ""
        except urllib.error.HTTPError as err:
            self.reached = True
            try:
                body = err.read()
            except OSError:
                body = b""
            return err.code, err.headers or {}, body, ""
        except TimeoutError:
            return None, {}, b"", f"timed out after {self.timeout_s:g} s"
        except urllib.error.URLError as err:
            if isinstance(err.reason, TimeoutError):
                return None, {}, b"", f"timed out after {self.timeout_s:g} s"
            return None, {}, b"", f"cannot reach {self.url}: {self._clean(str(err.reason))}"
        except (OSError, http.client.HTTPException) as err:  # reset or cut mid-answer
            why = self._clean(str(err) or type(err).__name__)
            return None, {}, b"", f"connection lost: {why}"

    def _clean(self, text: str) -> str:
        """`text` without the key, should a server echo it."""
        return text.replace(self._api_key, "***") if self._api_key else text
