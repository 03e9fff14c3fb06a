"""``GatewayOutputs``: what the engine produced for each gateway, until that gateway takes it.

Token delivery costs no Ray round trip per token: each gateway keeps one long-lived streaming
call per replica (``ReplicaActor.stream_outputs``), and every item is everything produced for that
gateway's sessions since its last item. The stream follows its reader: Ray holds the generator
while the gateway has not consumed its previous items (``STREAM_BACKPRESSURE`` of them), and what
the engine produces meanwhile is merged into the next item (flow control, not timers), so a busy
gateway gets fewer, larger items instead of a growing queue.

An item is a list of entries in the order the engine produced them (``replica.api.TokenEntry``
for the tokens of a running turn, merged per turn; ``TurnEvent`` for the last event of a turn and
events about a session). A turn's events go to the gateway that submitted it
(``TurnEvent.gateway_id``). When a gateway's stream ends (the gateway stopped or died: Ray closes
the generator of a caller that is gone), its outbox goes and ``on_gone(gateway_id)`` is called;
events for it are dropped from then on, until it streams again; ``release_streams_of`` then
releases the sessions its Converse streams held open, which ended with it. When the engine dies,
``fail`` ends every stream with an error, as the death of the replica's process would: each
gateway then asks the router what became of the replica's sessions (restored elsewhere from their
checkpoints, or gone); ``close`` (the replica shuts down) ends them quietly. Used on the actor's
event loop, but for ``release_streams_of``, which runs on the engine thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

from cachetools import LRUCache

from replica.api import DeliveryEntry, ReleaseReason, TurnEvent

if TYPE_CHECKING:
    from replica.engine.engine import Engine

STREAM_BACKPRESSURE = 2  # items Ray lets a gateway leave unconsumed before the stream waits
MAX_GONE = 10_000  # gateways remembered as gone (least recently gone forgotten first)


class ReplicaFailedError(RuntimeError):
    """The replica's engine died: its output streams end with this."""


class Outbox:
    """One gateway's entries not yet taken, with the tokens of a running turn merged."""

    __slots__ = ("entries", "closed", "_tokens_at", "_waiter")

    def __init__(self, waiting: Outbox | None = None) -> None:
        """A fresh outbox, holding the entries ``waiting`` has not handed out when given."""
        self.entries: list[DeliveryEntry] = waiting.entries if waiting else []
        self._tokens_at: dict[str, int] = waiting._tokens_at if waiting else {}
        self._waiter: asyncio.Future | None = None  # the stream waiting for an entry
        self.closed = False

    def add(self, event: TurnEvent) -> None:
        if event.finished or event.turn_id < 0:
            self.entries.append(event)
            self._tokens_at.pop(event.session_id, None)
        else:
            at = self._tokens_at.get(event.session_id)
            entry = self.entries[at] if at is not None else None
            if entry is not None and entry[1] == event.turn_id:
                entry[2].extend(event.token_ids)
                entry[3] += event.text
            else:
                self._tokens_at[event.session_id] = len(self.entries)
                tokens = [event.session_id, event.turn_id, [*event.token_ids], event.text]
                self.entries.append(tokens)
        self._wake()

    def close(self) -> None:
        """No more entries: the stream ends once it has taken what is here."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[DeliveryEntry]:
        """Every entry so far (waits for one, unless closed)."""
        while not self.entries and not self.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        entries, self.entries = self.entries, []
        self._tokens_at.clear()
        return entries


class GatewayOutputs:
    def __init__(self, on_gone: Callable[[str], None] | None = None) -> None:
        self.on_gone = on_gone
        self._outboxes: dict[str, Outbox] = {}
        self._gone: LRUCache[str, bool] = LRUCache(MAX_GONE)
        self._closed = False
        self._failed: str | None = None

    def dispatch(self, events: Iterable[TurnEvent]) -> None:
        """Queue each event for its gateway (events without one, or for a gateway that is gone,
        have no reader). A gateway that has not streamed yet gets an outbox now: it streams
        before its first turn's events matter, and they wait for it."""
        for event in events:
            gateway = event.gateway_id
            if not gateway or gateway in self._gone:
                continue
            outbox = self._outboxes.get(gateway)
            if outbox is None:
                outbox = self._outboxes[gateway] = Outbox()
            outbox.add(event)

    async def stream(self, gateway_id: str) -> AsyncIterator[list[DeliveryEntry]]:
        """``gateway_id``'s items, until the stream is closed. A newer stream of the same gateway
        takes over (with the entries still waiting); an older one then gets nothing more."""
        self._gone.pop(gateway_id, None)
        outbox = Outbox(self._outboxes.get(gateway_id))
        self._outboxes[gateway_id] = outbox
        if self._closed:
            outbox.close()
        try:
            while not outbox.closed or outbox.entries:
                entries = await outbox.take()
                if entries:
                    yield entries
            if self._failed is not None:
                raise ReplicaFailedError(self._failed)
        finally:
            if self._outboxes.get(gateway_id) is outbox:  # not taken over by a newer stream
                del self._outboxes[gateway_id]
                self._gone[gateway_id] = True
                if self.on_gone is not None and not self._closed:
                    self.on_gone(gateway_id)

    def close(self) -> None:
        """The replica shuts down: every stream ends (its gateway's pump ends quietly)."""
        self._closed = True
        for outbox in self._outboxes.values():
            outbox.close()

    def fail(self, why: str) -> None:
        """The engine died: every stream, now and later, ends with ``ReplicaFailedError(why)``
        once it has handed out what the engine produced before."""
        self._failed = why
        self.close()


def release_streams_of(engine: Engine, gateway_id: str) -> list[str]:
    """On the engine thread: release the sessions that ``gateway_id``'s Converse streams held
    open (a lease, and their events going to that gateway), reason ``stream_ended``; their ids."""
    held = [  # a session moving away is the migration's: its lease lapses where it lands
        sid
        for sid, slot in engine.sessions.sessions.items()
        if slot.gateway_id == gateway_id and engine.leases.held(sid) and not slot.moving
    ]
    for sid in held:
        engine.close_session(sid, ReleaseReason.STREAM_ENDED)
    return held
