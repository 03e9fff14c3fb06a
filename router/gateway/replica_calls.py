"""``ReplicaCalls``: a gateway's opens, turn submissions and releases on one replica, batched
(``router.gateway.batching``): what piles up while the previous call to the replica is in flight
goes as one call (``ReplicaActor.open_sessions``, ``submit_turns``, ``close_sessions``).

Each request gets its own result: an open its ``SessionInfo`` (or refusal) and the snapshot the
replica took after the batch; a submission its turn id (or refusal); a release whether the session
was open, the snapshot and whether it is moving to another replica (``Release``). A replica that
dies under a call raises its Ray error in every caller of the batch.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from replica.actor.client import ReplicaClient
from replica.api import (
    ActorError,
    Closed,
    ForkedTurn,
    OpenArgs,
    OpenedBatch,
    PoolSnapshot,
    ReleaseReason,
    TurnArgs,
)
from router.gateway.batching import CallBatcher

# a turn submitted just after a batch went out goes at once in a second call rather than waiting
# for that one's round trip (submissions of one session never overlap: its inbox is claimed)
SUBMITS_IN_FLIGHT = 2


class Release(NamedTuple):
    """What a release found: whether the session was open here (and is released now), the
    replica's snapshot right after, and whether it was moving away (so it was not released)."""

    was_open: bool
    snapshot: PoolSnapshot
    moving: bool


class ReplicaCalls:
    def __init__(self, gateway_id: str, handle: Any) -> None:
        self.gateway_id = gateway_id
        self.replica = ReplicaClient(handle)
        self.opens = CallBatcher(self._open)
        self.submits = CallBatcher(self._submit, SUBMITS_IN_FLIGHT)
        self._closes: dict[ReleaseReason, CallBatcher] = {}

    async def _open(self, requests: list[OpenArgs]) -> list[tuple] | ActorError:
        batch: OpenedBatch | ActorError = await self.replica.open_sessions(requests=requests)
        if isinstance(batch, ActorError):
            return batch
        return [(result, batch.snapshot) for result in batch.results]

    async def _submit(
        self, turns: list[TurnArgs]
    ) -> list[int | ForkedTurn | ActorError] | ActorError:
        return await self.replica.submit_turns(gateway_id=self.gateway_id, turns=turns)

    def open(self, args: OpenArgs) -> asyncio.Future:
        """The future of an open: ``(SessionInfo or its refusal, snapshot)``, or an
        ``ActorError`` for the whole call."""
        return self.opens.submit(args)

    async def submit(self, turn: TurnArgs) -> int | ForkedTurn | ActorError:
        """A turn's id (a ``ForkedTurn`` for one that asked for a fork), or its refusal."""
        return await self.submits.call(turn)

    async def close(self, session_id: str, reason: ReleaseReason) -> Release | ActorError:
        """Release ``session_id`` on the replica (idempotent)."""
        batcher = self._closes.get(reason)
        if batcher is None:

            async def close(ids: list[str]) -> list[Release] | ActorError:
                closed: Closed | ActorError = await self.replica.close_sessions(
                    session_ids=ids, reason=reason
                )
                if isinstance(closed, ActorError):
                    return closed
                return [
                    Release(was_open, closed.snapshot, sid in closed.moving)
                    for sid, was_open in zip(ids, closed.was_open, strict=True)
                ]

            batcher = self._closes[reason] = CallBatcher(close)
        return await batcher.call(session_id)

    @property
    def batchers(self) -> list[CallBatcher]:
        """Its batchers: opens, submissions and each release reason's closes."""
        return [self.opens, self.submits, *self._closes.values()]


class ReplicaCallsByReplica:
    """This gateway's ``ReplicaCalls`` of each replica, made on first use and kept until the
    replica is forgotten (it died: replacements get fresh ids)."""

    def __init__(self, gateway_id: str) -> None:
        self.gateway_id = gateway_id
        self._calls: dict[str, ReplicaCalls] = {}

    def of(self, replica_id: str, handle: Any) -> ReplicaCalls:
        calls = self._calls.get(replica_id)
        if calls is None:
            calls = self._calls[replica_id] = ReplicaCalls(self.gateway_id, handle)
        return calls

    def forget(self, replica_id: str) -> None:
        self._calls.pop(replica_id, None)

    @property
    def batchers(self) -> list[CallBatcher]:
        """The batchers of every replica's calls."""
        return [batcher for calls in self._calls.values() for batcher in calls.batchers]
