"""The candidate's replies: parsed with limits, checked against each command's schema.

A reply the harness could not have written is `MalformedReply` (verdict `tampering`), never
an exception of another kind: the grader would answer that `sandbox_error`, which clients
retry, for what is the candidate's doing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandbox import replies
from sandbox.replies import MalformedReply

RUN = {"cmd": "run", "outputs": [{"shape": [2, 3], "dtype": "float32", "path": "out"}]}
GOOD_RUN = {
    "ok": True,
    "seq": 3,
    "launches": 1,
    "count": 1,
    "outputs": [
        {
            "type": "Tensor",
            "written": True,
            "shape": [2, 3],
            "dtype": "float32",
            "aliases_input": False,
        }
    ],
    "call_s": 0.01,
    "inputs_s": 0.0,
    "outputs_s": 0.001,
    "harness_s": 0.02,
}


def _run_reply(**changes: Any) -> dict[str, Any]:
    reply = json.loads(json.dumps(GOOD_RUN))
    reply.update(changes)
    return reply


def test_what_the_harness_sends_passes() -> None:
    assert replies.check(RUN, replies.parse(json.dumps(GOOD_RUN).encode())) == GOOD_RUN
    failed = {"ok": False, "seq": 3, "error_type": "runtime_error", "message": "boom"}
    assert replies.check(RUN, failed) == failed
    assert replies.check({"cmd": "ping"}, {"ok": True, "seq": 9}) == {"ok": True, "seq": 9}
    timed = {"ok": True, "seq": 4, "times": [0.5, 0.25], "loop_s": 1.0}
    assert replies.check({"cmd": "time", "runs": 2}, timed) == timed
    walled = {"ok": True, "seq": 5, "times": [0.5], "loop_s": 1.0}
    assert replies.check({"cmd": "time", "runs": 7, "wall": True}, walled) == walled
    # A returned non-tensor is described by its type alone; a compile pass asks for none.
    other = _run_reply(outputs=[{"type": "int", "written": False}])
    assert replies.check(RUN, other) == other
    assert replies.check({"cmd": "run", "outputs": []}, _run_reply(outputs=[], count=3))
    ready = {"ok": True, "seq": None, "ready": True, "jail_missing": [], "startup": {"jail": 1.5}}
    assert replies.check_ready(ready) == ready


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"ok": true, "x": ' + b"[" * 20 + b"]" * 20 + b"}", "nested deeper"),
        (b'{"ok": true, "call_s": NaN}', "NaN"),
        (b'{"ok": true, "call_s": Infinity}', "Infinity"),
        (b'{"ok": true, "call_s": 1e999}', "finite"),
        (b'{"ok": false, "ok": true}', "twice"),
        (b'["ok"]', "not an object"),
        (b"\xff\xfe not json", "not JSON"),
        (b'{"ok": true, "n": ' + b"9" * 5000 + b"}", "not JSON"),
        (b" " * (replies.MAX_REPLY_BYTES + 1), "more than"),
    ],
)
def test_unparseable_replies_are_malformed(raw: bytes, why: str) -> None:
    with pytest.raises(MalformedReply) as malformed:
        replies.parse(raw)
    assert why in malformed.value.why and malformed.value.verdict == "tampering"


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (_run_reply(launches="many"), "launches"),
        (_run_reply(launches=True), "launches"),  # a bool is not a count
        (_run_reply(launches=-1), "launches"),
        (_run_reply(count=1, outputs=[]), "0 outputs described for 1 returned"),
        (_run_reply(count=5, outputs=GOOD_RUN["outputs"] * 5), "5 outputs described"),
        (_run_reply(outputs={"0": {}}), "not a list"),
        (_run_reply(outputs=[[]]), "not an object"),
        (_run_reply(outputs=[{"type": "Tensor", "written": True}]), "missing"),
        (_run_reply(outputs=[dict(GOOD_RUN["outputs"][0], shape=[2, "3"])]), "shape[1]"),
        (_run_reply(outputs=[dict(GOOD_RUN["outputs"][0], dtype="x" * 10**5)]), "characters"),
        (_run_reply(call_s="0.1"), "call_s"),
        (_run_reply(mutated=[]), "unexpected"),
        (_run_reply(ok="yes"), "ok"),
        (_run_reply(seq="3"), "seq"),
        ({k: v for k, v in GOOD_RUN.items() if k != "launches"}, "missing"),
        ({"ok": False, "seq": 3, "error_type": "correct", "message": ""}, "error_type"),
        ({"ok": False, "seq": 3, "error_type": ["runtime_error"], "message": ""}, "error_type"),
        ({"ok": False, "seq": 3, "error_type": "runtime_error", "message": "x" * 10**6}, "more"),
        ({"ok": False, "seq": 3, "error_type": "runtime_error"}, "missing"),
    ],
)
def test_replies_off_the_schema_are_malformed(reply: dict[str, Any], why: str) -> None:
    with pytest.raises(MalformedReply) as malformed:
        replies.check(RUN, reply)
    assert why in malformed.value.why


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        ({"cmd": "time", "runs": 3}, {"ok": True, "seq": 1, "times": [1.0], "loop_s": 0.1}),
        ({"cmd": "time", "runs": 3, "wall": True}, {"ok": True, "seq": 1, "times": [1.0] * 3}),
        ({"cmd": "memory"}, {"ok": True, "seq": 1, "peak_bytes": 1.5}),
        ({"cmd": "ping"}, {"ok": True, "seq": 1, "extra": 0}),
        ({"cmd": "ping"}, {"ok": False, "seq": 1}),
    ],
)
def test_each_command_has_its_own_schema(command: dict[str, Any], reply: dict[str, Any]) -> None:
    with pytest.raises(MalformedReply):
        replies.check(command, reply)


def test_a_launcher_request_carries_nothing_else() -> None:
    assert replies.is_launcher_request({"build_launcher": ["*fp32"]})
    assert not replies.is_launcher_request({"ok": True, "seq": 1})
    with pytest.raises(MalformedReply):
        replies.is_launcher_request({"build_launcher": ["*fp32"], "ok": True})


def test_a_ready_message_must_say_ready() -> None:
    with pytest.raises(MalformedReply):
        replies.check_ready({"ok": True, "seq": None})
    with pytest.raises(MalformedReply):
        replies.check_ready(
            {"ok": True, "seq": None, "ready": True, "jail_missing": [], "startup": {"a": "b"}}
        )


def test_the_candidates_text_reaches_a_terminal_inert() -> None:
    """Its log and messages may hold escape sequences (a cleared screen, a forged verdict,
    a retitled window): the text report shows them as escapes."""
    from sandbox.result import TrialOutcome, VerifyResult, printable

    forged = "\x1b[2J\x1b]0;title\x07\rverdict: CORRECT\u202e\x9b31m"
    shown = printable(forged + "\nnext line\tand a tab, é 日本")
    assert not any(ch in shown for ch in "\x1b\x07\r\u202e\x9b")
    assert shown.startswith("\\x1b[2J\\x1b]0;title\\x07\\rverdict")
    assert shown.endswith("\nnext line\tand a tab, é 日本")
    result = VerifyResult(
        verdict="runtime_error",
        message=forged,
        candidate_log=forged,
        trials=[TrialOutcome(index=0, passed=False, message=forged)],
    )
    safe = result.for_terminal()
    assert "\x1b" not in safe.message + safe.candidate_log + safe.trials[0].message
    assert result.message == forged  # the result itself is left as it was


def test_a_loop_mark_is_exactly_one_integer_field() -> None:
    """The harness marks a host-clock loop's end with `{"loop_done": seq}`; anything more
    in a message that says `loop_done` is something else writing on the pipe."""
    assert replies.is_loop_mark({"loop_done": 3})
    assert not replies.is_loop_mark({"ok": True, "seq": 3})
    for forged in ({"loop_done": 3, "seq": 3}, {"loop_done": "3"}, {"loop_done": True}):
        with pytest.raises(replies.MalformedReply):
            replies.is_loop_mark(forged)


def test_lone_surrogates_in_a_reply_become_replacement_characters() -> None:
    """JSON can escape a lone surrogate that no UTF-8 encoder takes; left in a message it
    would fail the answer to the client."""
    raw = b'{"error": "boom \\udc80", "error_type": "RuntimeError", "\\ud800k": 1}'
    reply = replies.parse(raw)
    for text in [*reply, *(v for v in reply.values() if isinstance(v, str))]:
        text.encode("utf-8")  # raises if a surrogate is left
    assert reply["error"].startswith("boom ")
