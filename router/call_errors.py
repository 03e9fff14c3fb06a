"""Who is to blame when a call to a replica (or its checkpoint store) raises: read by Ray's types.

Every place that catches an exception from an actor call reads it with ``classify`` and acts on
the kind alone:

- ``DEAD`` (``ActorDiedError``, or the plain ``RayActorError`` some paths still raise): the actor
  is gone. Only this (or a failed health probe) fences a replica and fails its sessions over.
- ``TRANSIENT`` (``ActorUnavailableError``: restarting or unreachable for now; any other Ray or
  system error of the call itself): the caller retries within its deadline (``retrying``), then
  answers UNAVAILABLE. The actor is not fenced: if it is really dead, its death is seen as such.
- ``APPLICATION`` (``RayTaskError``: the callee ran and raised, a bug or an unmapped fault): the
  callee is alive and stays in service; that call fails INTERNAL with a message, logged once with
  its traceback where it is caught, and counted
  (``session_router_replica_call_errors_total{method,kind}``).

``RayTaskError`` is checked first: a callee that raised another actor's death error reaches its
caller as a ``RayTaskError`` that is also an ``ActorDiedError`` (Ray's dual instance), and that
callee is alive. ``object_lost``: the callee raised because an object it fetched was lost (its
owner died, it was freed, the fetch timed out); in an import the source of the object is to
blame, never the importing target.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ray import exceptions as rex

from replica.api import ActorError, StatusCode

T = TypeVar("T")

RETRY_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.8)  # after each transient failure; then UNAVAILABLE
RETRY_BUDGET_S = 2.0  # a call without a deadline of its own retries at most this long


class FailureKind(enum.Enum):
    DEAD = "dead"
    TRANSIENT = "transient"
    APPLICATION = "application"


def classify(exc: BaseException) -> FailureKind:
    """The kind of failure ``exc`` (raised by awaiting an actor call) is."""
    if isinstance(exc, rex.RayTaskError):
        return FailureKind.APPLICATION
    if isinstance(exc, rex.ActorUnavailableError):
        return FailureKind.TRANSIENT
    if isinstance(exc, rex.RayActorError):  # ActorDiedError and its base
        return FailureKind.DEAD
    if isinstance(exc, rex.RayError | OSError | asyncio.TimeoutError | ConnectionError):
        return FailureKind.TRANSIENT
    return FailureKind.APPLICATION  # raised by our own code around the call: a bug here


def object_lost(exc: BaseException) -> bool:
    """Whether the callee failed because an object it fetched is lost (its owner is to blame)."""
    cause = exc.cause if isinstance(exc, rex.RayTaskError) else exc
    return isinstance(cause, rex.ObjectLostError)


@dataclass(frozen=True, slots=True)
class CallFailure:
    """A failed call ``method`` on ``actor``, read: what kind, and the status and message its
    caller answers with when it does not follow the session elsewhere."""

    method: str
    actor: str
    kind: FailureKind
    error: BaseException

    @classmethod
    def of(cls, method: str, actor: str, exc: BaseException) -> CallFailure:
        return cls(method, actor, classify(exc), exc)

    @property
    def cause(self) -> str:
        inner = self.error.cause if isinstance(self.error, rex.RayTaskError) else self.error
        return f"{type(inner).__name__}: {str(inner).splitlines()[0] if str(inner) else ''}"

    def status(self) -> StatusCode:
        if self.kind is FailureKind.APPLICATION:
            return StatusCode.INTERNAL
        return StatusCode.UNAVAILABLE

    def message(self) -> str:
        if self.kind is FailureKind.APPLICATION:
            return (
                f"internal error in {self.method} on {self.actor} ({self.cause}); it stays in "
                "service: retry the call, and report the error if it persists"
            )
        if self.kind is FailureKind.TRANSIENT:
            return f"{self.actor} did not answer {self.method} ({self.cause}); retry"
        return f"{self.actor} died during {self.method}; retry"

    def actor_error(self) -> ActorError:
        return ActorError(self.status(), self.message())


def log_failure(logger: logging.Logger, failure: CallFailure) -> None:
    """Log ``failure`` once, where it was caught: an application error with its traceback."""
    if failure.kind is FailureKind.APPLICATION:
        logger.error("%s", failure.message(), exc_info=failure.error)
    elif failure.kind is FailureKind.TRANSIENT:
        logger.warning("%s", failure.message())
    else:
        logger.error("%s", failure.message())


async def retrying(make: Callable[[], Awaitable[T]], deadline: float | None = None) -> T:
    """``await make()``, made again after each TRANSIENT failure with backoff while the
    ``deadline`` (``time.monotonic()``; default ``RETRY_BUDGET_S`` from now) allows; any other
    failure, or the last transient one, is raised. Only for calls that are safe to repeat."""
    end = time.monotonic() + RETRY_BUDGET_S if deadline is None else deadline
    for pause in (*RETRY_BACKOFF_S, None):
        try:
            return await make()
        except Exception as exc:  # noqa: BLE001 - read, then raised again
            if pause is None or classify(exc) is not FailureKind.TRANSIENT:
                raise
            if time.monotonic() + pause >= end:
                raise
        await asyncio.sleep(pause)
    raise AssertionError("unreachable")
