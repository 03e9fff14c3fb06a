"""``Delivery``: turn events from the replicas to this gateway's calls.

Token delivery costs no Ray round trip per token: for each replica the gateway keeps one
long-lived ``stream_outputs`` call whose items carry everything an engine step produced for this
gateway's sessions; the pump hands each event to the inbox of its session, if a call of this
gateway streams that session now. When a replica's stream breaks, ``on_lost(replica_id, why)`` is
called; ``end_replica`` then ends every waiting call of that replica's sessions, so no client
hangs on a turn that will never end: with UNAVAILABLE where the session was restored elsewhere
from its checkpoint (retry the turn), with ABORTED where its state is gone. A call whose session
moved (``move``) waits on its new replica; news of the old one's death no longer concerns it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import StatusCode, TurnEvent, replica_lost_message, session_restored_message
from router.control.table import Route

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaLost:
    """An inbox item: the replica the inbox's session was on died; ``committed_tokens`` is
    where the session continues (restored elsewhere from its checkpoint), None when its state
    is gone."""

    replica_id: str
    committed_tokens: int | None

    def event(self, session_id: str) -> TurnEvent:
        if self.committed_tokens is None:
            error = replica_lost_message(session_id)
            return TurnEvent(session_id, -1, error_code=StatusCode.ABORTED, error=error)
        error = session_restored_message(session_id, self.committed_tokens)
        return TurnEvent(
            session_id,
            -1,
            committed_tokens=self.committed_tokens,
            error_code=StatusCode.UNAVAILABLE,
            error=error,
        )


@dataclasses.dataclass(eq=False)
class Inbox:
    """The events of one session while one call streams it; the call may add its own items."""

    session_id: str
    replica_id: str
    queue: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)

    def put(self, item: Any) -> None:
        self.queue.put_nowait(item)

    async def get(self) -> Any:
        return await self.queue.get()


async def next_turn_event(inbox: Inbox, turn_id: int) -> TurnEvent:
    """The next event of turn ``turn_id`` (or of the replica's loss), merged with the events of
    that turn already queued behind it: a client that falls behind gets fewer, larger chunks."""
    event: TurnEvent | None = None
    queue = inbox.queue
    while event is None or (not event.finished and not queue.empty()):
        item = await queue.get()  # does not wait once ``event`` is set: the queue is not empty
        if isinstance(item, ReplicaLost):
            if item.replica_id != inbox.replica_id:
                continue  # the session had moved off that replica
            item = item.event(inbox.session_id)
        if item.turn_id not in (turn_id, -1):
            continue  # a stale event of an earlier turn
        if event is None or item.error_code is not None:
            event = item
        else:
            event = dataclasses.replace(
                item, token_ids=event.token_ids + item.token_ids, text=event.text + item.text
            )
    return event


class Delivery:
    def __init__(self, gateway_id: str, on_lost: Callable[[str, str], Awaitable[None]]) -> None:
        self.gateway_id = gateway_id
        self.on_lost = on_lost
        self._inboxes: dict[str, Inbox] = {}
        self._pumps: dict[str, asyncio.Task] = {}

    def claim(self, route: Route) -> Inbox | None:
        """The inbox of ``route``'s session for one call; None when another call of this gateway
        already streams that session (a turn is in flight)."""
        if route.session_id in self._inboxes:
            return None
        self.watch(route)
        inbox = self._inboxes[route.session_id] = Inbox(route.session_id, route.replica_id)
        return inbox

    def move(self, inbox: Inbox, route: Route) -> None:
        """The inbox's session is on ``route``'s replica now: its events come from there."""
        if inbox.replica_id != route.replica_id:
            inbox.replica_id = route.replica_id
            self.watch(route)

    def release(self, inbox: Inbox) -> None:
        if self._inboxes.get(inbox.session_id) is inbox:
            del self._inboxes[inbox.session_id]

    def watch(self, route: Route) -> None:
        """Make sure this gateway streams the outputs of ``route``'s replica."""
        pump = self._pumps.get(route.replica_id)
        if pump is None or pump.done():
            loop = asyncio.get_running_loop()
            self._pumps[route.replica_id] = loop.create_task(self._pump(route))

    async def _pump(self, route: Route) -> None:
        try:
            async for ref in route.handle.stream_outputs.remote(self.gateway_id):
                for event in await ref:
                    inbox = self._inboxes.get(event.session_id)
                    if inbox is not None:
                        inbox.put(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died
            log.error("output stream of replica %s broke: %s", route.replica_id, exc)
            await self.on_lost(route.replica_id, f"output stream broke: {type(exc).__name__}")

    def end_replica(self, replica_id: str, restored: dict[str, int]) -> None:
        """End the calls streaming sessions of a dead replica: those ``restored`` (session id
        -> committed tokens) were restored elsewhere from their checkpoints, the others' state
        is gone."""
        for inbox in [i for i in self._inboxes.values() if i.replica_id == replica_id]:
            inbox.put(ReplicaLost(replica_id, restored.get(inbox.session_id)))

    def stop(self) -> None:
        for task in self._pumps.values():
            task.cancel()
