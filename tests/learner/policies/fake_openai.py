"""A scripted OpenAI-compatible chat-completions server on a local port, for the tests.

A problem's text names its case (`case_<kind>_<tag>`), and the case decides the answer:
good, not JSON, 429 with Retry-After then good, a first call that hangs then good, a call
that always hangs, always 500, a 400, an answer cut at the token limit. Server-wide
switches: a required key, ignoring `n`, refusing `n` > 1, a delay per call.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CASE = re.compile(r"case_([a-z]+)_(\w+)")
HANG_S = 20.0


def problem(kind: str, tag: str | int = 0) -> str:
    """A problem source whose prompt selects a case."""
    return f"def fused_operator(tensor_0):  # case_{kind}_{tag}\n    return [tensor_0]\n"


def answer_text(case: str, seed: Any, index: int) -> str:
    return f"<triton_code>\n# {case} seed={seed} choice={index}\n</triton_code>"


class FakeServer:
    def __init__(self) -> None:
        self.key: str | None = None
        self.ignore_n = False
        self.reject_n = False
        self.delay_s = 0.0
        self.calls: Counter[str] = Counter()
        self.payloads: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = threading.Event()  # lets hanging calls go at teardown
        self._lock = threading.Lock()
        self.url = ""

    # -- the answers ------------------------------------------------------------------------

    def respond(self, payload: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict, bytes]:
        prompt = payload["messages"][-1]["content"]
        found = CASE.search(prompt)
        kind, case = (found.group(1), found.group(0)) if found else ("good", "case_good_none")
        with self._lock:
            self.calls[case] += 1
            self.payloads.append(payload)
            self.headers.append(headers)
            count = self.calls[case]
        if self.key is not None and headers.get("authorization") != f"Bearer {self.key}":
            given = headers.get("authorization", "")
            return 401, {}, _error(f"Incorrect API key provided: {given[7:]}")
        n = payload.get("n", 1)
        if self.reject_n and n > 1:
            return 400, {}, _error("n must be 1")
        if self.delay_s:
            time.sleep(self.delay_s)
        if kind == "badjson":
            return 200, {}, b"{'choices': not json"
        if kind == "ratelimited" and count == 1:
            return 429, {"Retry-After": "1"}, _error("Rate limit reached")
        if kind == "slow" and count == 1 or kind == "hang":
            self.release.wait(HANG_S)
        if kind == "broken":
            return 500, {}, _error("internal error")
        if kind == "refused":
            return 400, {}, _error("This model's maximum context length is 8192 tokens")
        finish, tail = "stop", ""
        if kind == "truncated":
            finish = "length"
        if kind == "cutopen":
            finish, tail = "length", "<triton_code>\nimport torch\n"
        choices = [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": tail or answer_text(case, payload.get("seed"), i),
                },
                "finish_reason": finish,
            }
            for i in range(1 if self.ignore_n else n)
        ]
        usage = {"prompt_tokens": 100, "completion_tokens": 12 * len(choices)}
        return (
            200,
            {"Content-Type": "application/json"},
            json.dumps(
                {"id": "x", "object": "chat.completion", "choices": choices, "usage": usage}
            ).encode(),
        )


def _error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "x"}}).encode()


def _handler(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            with server._lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            counted = True
            try:
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if self.path != "/v1/chat/completions":
                    status, extra, body = 404, {}, _error(f"no route {self.path}")
                else:
                    status, extra, body = server.respond(payload, headers)
                # Out of flight before the client can see the answer: once it has it, it may
                # send its next request before this thread would reach `finally`.
                with server._lock:
                    server.in_flight -= 1
                counted = False
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (a time-out): nothing to answer
            finally:
                if counted:
                    with server._lock:
                        server.in_flight -= 1

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@contextmanager
def serve() -> Iterator[FakeServer]:
    """A FakeServer listening on 127.0.0.1 (its base URL in `.url`) until the block ends."""
    fake = FakeServer()
    httpd = _QuietServer(("127.0.0.1", 0), _handler(fake))
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
