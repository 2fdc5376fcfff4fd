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
