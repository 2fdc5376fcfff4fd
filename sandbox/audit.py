"""The server's audit log: one JSON line per finished verification request.

Each line says who asked (client identity and peer), what (request id and the SHA-256 of
problem and candidate, never the sources), the outcome (verdict, or the RPC status of a
request that got none) and how long it took. Calls refused for want of a token are logged
too. Lines go out with one `write` on a descriptor opened with O_APPEND, so concurrent
writers (several servers sharing a file included) never interleave within a line.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from typing import Any

log = logging.getLogger("drtriton.sandbox.audit")

# A request id is the client's own text: bound what it can add to a line.
MAX_REQUEST_ID_CHARS = 200


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def utc_now() -> str:
    """UTC time in ISO 8601 with milliseconds and a `Z`."""
    now = datetime.datetime.now(datetime.UTC)
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def audit_entry(
    *,
    method: str,
    client: str,
    peer: str,
    status: str,
    seconds: float,
    request_id: str = "",
    problem: str | None = None,
    candidate: str | None = None,
    verdict: str | None = None,
) -> dict[str, Any]:
    """The record of one request (`status` is the gRPC status name, OK for a verdict)."""
    return {
        "time": utc_now(),
        "client": client,
        "peer": peer,
        "method": method,
        "request_id": request_id[:MAX_REQUEST_ID_CHARS],
        "problem_sha256": None if problem is None else sha256_hex(problem),
        "candidate_sha256": None if candidate is None else sha256_hex(candidate),
        "verdict": verdict,
        "status": status,
        "seconds": round(seconds, 3),
    }


class DenialThrottle:
    """At most one audit line per source of refused calls every `interval_s`.

    Calls refused for want of a token cost the caller nothing, so logging each one would
    let anyone who can reach the port fill the disk. The first refusal from a source in a
    window is written; the rest are counted and the count rides on the next line written
    for that source (`suppressed`).
    """

    def __init__(self, interval_s: float = 10.0, max_sources: int = 10_000) -> None:
        self.interval_s, self.max_sources = interval_s, max_sources
        self._sources: dict[str, tuple[float, int]] = {}  # source -> (window start, hidden)

    def admit(self, source: str, now: float) -> int | None:
        """The number of refusals hidden since this source's last line, when a line is due
        now; None when this refusal is only counted."""
        start, hidden = self._sources.get(source, (float("-inf"), 0))
        if now - start < self.interval_s:
            self._sources[source] = (start, hidden + 1)
            return None
        if source not in self._sources and len(self._sources) >= self.max_sources:
            self._sources = {
                key: value
                for key, value in self._sources.items()
                if now - value[0] < self.interval_s
            }
        self._sources[source] = (now, 0)
        return hidden


class AuditLog:
    """An append-only JSONL file (created with mode 0600 if absent)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd: int | None = os.open(self.path, flags, 0o600)

    def write(self, entry: dict[str, Any]) -> None:
        """Append one line; a failed write is logged, never raised into a request."""
        if self._fd is None:
            return
        line = (json.dumps(entry, ensure_ascii=True, separators=(",", ":")) + "\n").encode()
        try:
            written = os.write(self._fd, line)
        except OSError as err:
            log.error("audit log %s: %s", self.path, err)
            return
        if written != len(line):
            log.error("audit log %s: short write (%d of %d bytes)", self.path, written, len(line))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
