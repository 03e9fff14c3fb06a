"""Typed errors of the replica. The gateway maps each to one gRPC status code (see DESIGN.md)."""

from __future__ import annotations


class ReplicaError(Exception):
    """Base class; ``code`` names the gRPC status the gateway answers with."""

    code = "INTERNAL"


class PoolExhaustedError(ReplicaError):
    """A pool has too few free slots for an allocation. Raised instead of asserting."""

    code = "RESOURCE_EXHAUSTED"


class SlotStateError(ReplicaError):
    """Misuse of a pool: double free, freeing a slot never allocated, an index out of range."""

    code = "INTERNAL"


class SessionNotFoundError(ReplicaError):
    code = "NOT_FOUND"


class TurnRunningError(ReplicaError):
    code = "FAILED_PRECONDITION"


class ContextOverflowError(ReplicaError):
    code = "OUT_OF_RANGE"


class InvalidRequestError(ReplicaError):
    code = "INVALID_ARGUMENT"


class ReplicaDrainingError(ReplicaError):
    code = "RESOURCE_EXHAUSTED"
