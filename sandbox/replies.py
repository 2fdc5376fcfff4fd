"""The candidate's replies, parsed with limits and checked against a strict schema.

The candidate's harness (`sandbox.candidate`) answers each command with one JSON object.
Everything in the candidate's process is the candidate's to change, so a reply is data
from an adversary: it is parsed with a size limit, a nesting limit, no NaN or infinite
numbers and no repeated keys, and then checked against what the command it answers may
say: exactly the keys listed below, each of its type, lists as long as what was asked.

A reply that breaks any of this is `MalformedReply`, answered `tampering`: the harness
writes only well-formed replies (a failure in the candidate's code is a well-formed
`{"ok": false, "error_type": ..., "message": ...}`, judged on its merits), so a malformed
one means that code in the candidate's process wrote on the grader's pipe or broke the
harness. It is a rejection of the candidate, never the sandbox's error.

Schema (every reply also carries `seq`: the command's number, echoed):

- any command, failed: `ok` false, `error_type` (one of `ERROR_TYPES`), `message` (str)
- `ready` (unasked, first): `ok`, `ready` true, `jail_missing` [str], `startup` {str: number}
- `load`, `stage`, `fetch`, `ping`: `ok` true
- `run`: `ok`, `launches` int >= 0, `count` int >= 0, `outputs` [output], `call_s`,
  `inputs_s`, `outputs_s`, `harness_s` (numbers); one output per output asked for, up to
  `count`; an output is `type` (str), `written` (bool), and for a `Tensor` also `shape`
  [int >= 0], `dtype` (str), `aliases_input` (bool)
- `time`: `ok`, `times` [number] (`runs` of them, one for a `wall` loop), `loop_s`
- `memory`: `ok`, `peak_bytes` int >= 0
- `probe`: `ok`, `uid`, `pid`, `gc_frozen` (ints), `capabilities`, `wrote_outside`,
  `connected` (bools)
- a launcher request, in the middle of a command: `build_launcher` (checked by
  `sandbox.launchers.valid_signature`), nothing else
- a loop mark, in the middle of a `wall` timing command: `loop_done` (the command's `seq`),
  nothing else: the harness's loop has ended, its own checks follow (`is_loop_mark`)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

MAX_REPLY_BYTES = 1 << 20
MAX_DEPTH = 8  # objects and lists inside one another (a run's reply needs 4)
MAX_LIST = 4096  # items of any list (outputs, shape, times, ...)
MAX_MESSAGE_CHARS = 16_000  # the harness sends at most the last 4,000 characters of an error
MAX_NAME_CHARS = 1_000  # type and dtype names, startup steps, missing jail features
# What a failed command may say went wrong (`gpu_full`: PyTorch's out-of-memory error under
# the candidate's cap, with the GPU full of other jobs: `trials.raise_if_gpu_full`).
ERROR_TYPES = frozenset(
    {
        "runtime_error",
        "compile_error",
        "resource_limit",
        "torch_fallback",
        "no_triton_kernel",
        "tampering",
        "wrong_output",
        "no_entry_point",
        "gpu_full",
        "sandbox_error",
    }
)


class MalformedReply(Exception):
    """A reply the harness could not have written: the candidate is rejected (`tampering`)."""

    verdict = "tampering"

    def __init__(self, why: str) -> None:
        super().__init__(f"the candidate's process sent a malformed reply: {why}")
        self.why = why
        self.message = str(self)


def parse(raw: bytes) -> dict[str, Any]:
    """One reply as an object, within the size and nesting limits (MalformedReply if not)."""
    if len(raw) > MAX_REPLY_BYTES:
        raise MalformedReply(f"{len(raw)} bytes, more than {MAX_REPLY_BYTES}")
    try:
        value = json.loads(
            raw,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:
        raise MalformedReply("nested too deeply") from None
    except MalformedReply:
        raise
    except (ValueError, UnicodeDecodeError) as err:
        raise MalformedReply(f"not JSON ({str(err)[:100]})") from None
    if not isinstance(value, dict):
        raise MalformedReply(f"a {type(value).__name__}, not an object")
    _check_depth(value)
    return _valid_text(value)


def check(command: Mapping[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """`reply`, if it is one the harness could send to `command` (MalformedReply if not)."""
    name = command.get("cmd", "")
    if reply.get("ok") is False:
        _exact(reply, {"ok": _is(bool), "seq": _seq, "error_type": _error_type, "message": _text})
        return reply
    fields = _OK_FIELDS.get(name)
    if fields is None:
        raise ValueError(f"no reply schema for command {name!r}")
    _exact(reply, {"ok": _true, "seq": _seq, **fields})
    if name == "run":
        _check_run(command, reply)
    elif name == "time":
        wanted = 1 if command.get("wall") else command.get("runs")
        if len(reply["times"]) != wanted:
            raise MalformedReply(f"{len(reply['times'])} times for a loop of {wanted}")
    return reply


def check_ready(reply: dict[str, Any]) -> dict[str, Any]:
    """The harness's first message, `ready` (sent before any candidate code runs)."""
    _exact(
        reply,
        {
            "ok": _true,
            "seq": _seq,
            "ready": _true,
            "jail_missing": _list_of(_name),
            "startup": _mapping_of(_number),
        },
    )
    return reply


def is_launcher_request(reply: dict[str, Any]) -> bool:
    """Whether this is a launcher request (`sandbox.launchers`) rather than a reply."""
    if "build_launcher" not in reply:
        return False
    if set(reply) != {"build_launcher"}:
        raise MalformedReply(f"a launcher request with {sorted(set(reply) - {'build_launcher'})}")
    return True


def is_loop_mark(reply: dict[str, Any]) -> bool:
    """Whether this is a loop mark (a host-clock loop's end, before the harness's checks)."""
    if "loop_done" not in reply:
        return False
    if set(reply) != {"loop_done"} or type(reply["loop_done"]) is not int:
        raise MalformedReply("a loop mark with other keys or a non-integer command number")
    return True


# -- the schema's pieces ------------------------------------------------------------------
Check = Callable[[Any, str], None]


def _exact(reply: dict[str, Any], fields: dict[str, Check]) -> None:
    """Exactly these keys, each passing its check."""
    extra = sorted(set(reply) - set(fields))
    missing = sorted(set(fields) - set(reply))
    if extra:
        raise MalformedReply(f"unexpected field(s) {_shown(extra)}")
    if missing:
        raise MalformedReply(f"missing field(s) {_shown(missing)}")
    for key, field_check in fields.items():
        field_check(reply[key], key)


def _is(kind: type) -> Check:
    def field_check(value: Any, key: str) -> None:
        if type(value) is not kind:
            raise MalformedReply(f"{key} is a {type(value).__name__}, not a {kind.__name__}")

    return field_check


def _true(value: Any, key: str) -> None:
    if value is not True:
        raise MalformedReply(f"{key} is {_shown(value)}, not true")


def _seq(value: Any, key: str) -> None:
    if value is not None and type(value) is not int:
        raise MalformedReply(f"{key} is a {type(value).__name__}")


MAX_COUNT = 2**31 - 1  # counts travel as 32-bit fields of the answer


def _count(value: Any, key: str) -> None:
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise MalformedReply(f"{key} is {_shown(value)}, not a count")


def _number(value: Any, key: str) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise MalformedReply(f"{key} is {_shown(value)}, not a finite number")


def _bounded_text(limit: int) -> Check:
    def field_check(value: Any, key: str) -> None:
        if type(value) is not str:
            raise MalformedReply(f"{key} is a {type(value).__name__}, not text")
        if len(value) > limit:
            raise MalformedReply(f"{key} holds {len(value)} characters, more than {limit}")

    return field_check


_text = _bounded_text(MAX_MESSAGE_CHARS)
_name = _bounded_text(MAX_NAME_CHARS)


def _error_type(value: Any, key: str) -> None:
    if type(value) is not str or value not in ERROR_TYPES:
        raise MalformedReply(f"{key} is {_shown(value)}, not a known kind of failure")


def _list_of(item: Check) -> Check:
    def field_check(value: Any, key: str) -> None:
        if type(value) is not list:
            raise MalformedReply(f"{key} is a {type(value).__name__}, not a list")
        if len(value) > MAX_LIST:
            raise MalformedReply(f"{key} holds {len(value)} items, more than {MAX_LIST}")
        for i, element in enumerate(value):
            item(element, f"{key}[{i}]")

    return field_check


def _mapping_of(item: Check) -> Check:
    def field_check(value: Any, key: str) -> None:
        if type(value) is not dict or len(value) > MAX_LIST:
            raise MalformedReply(f"{key} is not an object of at most {MAX_LIST} entries")
        for name, element in value.items():
            _name(name, f"{key} key")
            item(element, f"{key}[{name!r}]")

    return field_check


def _output(value: Any, key: str) -> None:
    """One output as the harness describes it (`run`)."""
    if type(value) is not dict:
        raise MalformedReply(f"{key} is a {type(value).__name__}, not an object")
    fields: dict[str, Check] = {"type": _name, "written": _is(bool)}
    if value.get("type") == "Tensor":
        fields.update(shape=_list_of(_count), dtype=_name, aliases_input=_is(bool))
    try:
        _exact(value, fields)
    except MalformedReply as err:
        raise MalformedReply(f"{key}: {err.why}") from None


_OK_FIELDS: dict[str, dict[str, Check]] = {
    "load": {},
    "stage": {},
    "fetch": {},
    "ping": {},
    "run": {
        "launches": _count,
        "count": _count,
        "outputs": _list_of(_output),
        "call_s": _number,
        "inputs_s": _number,
        "outputs_s": _number,
        "harness_s": _number,
    },
    "time": {"times": _list_of(_number), "loop_s": _number},
    "memory": {"peak_bytes": _count},
    "probe": {
        "uid": _is(int),
        "pid": _is(int),
        "gc_frozen": _is(int),
        "capabilities": _is(bool),
        "wrote_outside": _is(bool),
        "connected": _is(bool),
    },
}


def _check_run(command: Mapping[str, Any], reply: dict[str, Any]) -> None:
    """One output described per output asked for, up to the count returned."""
    asked = len(command.get("outputs", []))
    described = len(reply["outputs"])
    if described != min(reply["count"], asked):
        raise MalformedReply(
            f"{described} outputs described for {reply['count']} returned and {asked} asked"
        )


# -- parsing ------------------------------------------------------------------------------
def _refuse_constant(name: str) -> Any:
    raise MalformedReply(f"{name} is not a number a reply may hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MalformedReply(f"{text[:40]} is not a finite number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise MalformedReply("a key given twice")
    return value


def valid_text(text: str) -> str:
    """`text` without lone surrogates (JSON's `\\udc80` escapes make them), which no UTF-8
    encoder takes: a message carrying one would fail the answer to the client, turning
    the candidate's failure into the sandbox's."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _valid_text(value: Any) -> Any:
    """A parsed reply with every string (keys too) passed through `valid_text`; the
    nesting is already bounded by `_check_depth`."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, list):
        return [_valid_text(item) for item in value]
    if isinstance(value, dict):
        return {valid_text(key): _valid_text(item) for key, item in value.items()}
    return value


def _check_depth(value: Any) -> None:
    """At most MAX_DEPTH objects and lists inside one another (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise MalformedReply(f"nested deeper than {MAX_DEPTH}")
        children = item.values() if isinstance(item, dict) else item
        pending.extend((c, depth + 1) for c in children if isinstance(c, dict | list))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
