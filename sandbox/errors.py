"""Infrastructure errors: never a verdict on a kernel, always an RPC status."""

from __future__ import annotations


class SandboxInfrastructureError(Exception):
    """The sandbox could not judge the job (not the kernel's fault)."""


class QueueFullError(SandboxInfrastructureError):
    """Every queue place is taken: the client should back off and retry."""


class DrainingError(SandboxInfrastructureError):
    """The sandbox is shutting down and takes no new jobs."""


class InvalidRequestError(ValueError):
    """The request is malformed (empty sources, bad options)."""


class WeakIsolationError(RuntimeError):
    """The host lacks isolation features and weaker isolation was not accepted."""
