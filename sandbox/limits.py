"""Per-client limits of a server: jobs in flight at once, and source bytes per request.

One client must not fill every worker and queue place of a shared sandbox, nor make it
hold huge sources. A unary call over its client's limit is refused at once
(RESOURCE_EXHAUSTED, which clients retry with backoff); a stream's items wait for a place
instead, so HTTP/2 flow control holds the stream back. Clients are told apart by
`sandbox.auth.client_identity` (token name, certificate subject, or peer address).
"""

from __future__ import annotations

import asyncio

from protos.drtriton.sandbox.v1 import sandbox_pb2 as pb
from sandbox.errors import InvalidRequestError, SandboxInfrastructureError


class ClientLimitError(SandboxInfrastructureError):
    """This client has as many jobs in flight as it may: retry when one has finished."""


class SourceTooLargeError(InvalidRequestError):
    """Problem and candidate together are larger than the server takes."""


def check_source_size(request: pb.VerifyRequest, limit: int) -> None:
    """Refuse a request whose problem and candidate exceed `limit` bytes together (0: none)."""
    if limit <= 0:
        return
    size = len(request.problem.encode()) + len(request.candidate.encode())
    if size > limit:
        raise SourceTooLargeError(
            f"problem and candidate are {size} bytes together; "
            f"this server takes at most {limit} bytes per request"
        )


class InFlightLimiter:
    """Counts each client's jobs in flight; `limit` 0 means no limit.

    A place is held from `take` until `release`, which the server calls when the job
    itself ends, not when its call does: a client that abandons its calls does not get
    more jobs running. Runs on the server's event loop only (no locking). A client's
    entry goes when its count is back to zero, so peers that came once do not accumulate.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("the per-client in-flight limit must be >= 0")
        self.limit = limit
        self._counts: dict[str, int] = {}
        self._waiters: set[asyncio.Future[None]] = set()

    def in_flight(self, client: str) -> int:
        return self._counts.get(client, 0)

    def full(self, client: str) -> bool:
        return bool(self.limit) and self.in_flight(client) >= self.limit

    def take(self, client: str) -> None:
        """Claim a place, or raise ClientLimitError when the client has none left."""
        if self.full(client):
            raise ClientLimitError(
                f"{client} already has {self.limit} requests in flight, "
                "the most this server allows one client"
            )
        self._counts[client] = self.in_flight(client) + 1

    def release(self, client: str) -> None:
        left = self.in_flight(client) - 1
        if left > 0:
            self._counts[client] = left
        else:
            self._counts.pop(client, None)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_room(self, client: str) -> None:
        """Return once the client has a free place; `take` it before awaiting anything."""
        while self.full(client):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)
