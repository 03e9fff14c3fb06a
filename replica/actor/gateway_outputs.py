"""``GatewayOutputs``: what the engine produced for each gateway, until that gateway takes it.

Token delivery costs no Ray round trip per token: each gateway keeps one long-lived streaming
call per replica (``ReplicaActor.stream_outputs``), and every item is everything produced for that
gateway's sessions since its last item. The stream follows its reader: Ray holds the generator
while the gateway has not consumed its previous items (``STREAM_BACKPRESSURE`` of them), and what
the engine produces meanwhile is merged into the next item (flow control, not timers), so a busy
gateway gets fewer, larger items instead of a growing queue.

An item is a list of entries in the order the engine produced them (``replica.api.TokenRows``: the
rows of the engine's ``StepOutputs`` for that gateway's sessions, one token of one turn each, the
rows of consecutive steps merged into one entry; a ``TurnEvent`` for the last event of a turn and
events about a session). A record's rows are split by gateway only when they go to more than one:
a step of one gateway's turns costs the same calls here whatever their number. A turn's outputs
go to the gateway that submitted it (``gateway_id``). When a gateway's stream ends (the gateway
stopped or died: Ray closes the generator of a caller that is gone), its outbox goes and
``on_gone(gateway_id)`` is called; outputs for it are dropped from then on, until it streams
again; ``release_streams_of`` then releases the sessions its Converse streams held open, which
ended with it. When the engine dies, ``fail`` ends every stream with an error, as the death of
the replica's process would: each gateway then asks the router what became of the replica's
sessions (restored elsewhere from their checkpoints, or gone); ``close`` (the replica shuts down)
ends them quietly. Used on the actor's event loop, but for ``release_streams_of``, which runs on
the engine thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

from cachetools import LRUCache

from replica.api import DeliveryEntry, ReleaseReason, TurnEvent

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.engine.step_outputs import StepOutputs

STREAM_BACKPRESSURE = 2  # items Ray lets a gateway leave unconsumed before the stream waits
MAX_GONE = 10_000  # gateways remembered as gone (least recently gone forgotten first)


class ReplicaFailedError(RuntimeError):
    """The replica's engine died: its output streams end with this."""


class Outbox:
    """One gateway's entries not yet taken, with consecutive token rows merged."""

    __slots__ = ("entries", "closed", "_waiter")

    def __init__(self, waiting: Outbox | None = None) -> None:
        """A fresh outbox, holding the entries ``waiting`` has not handed out when given."""
        self.entries: list[DeliveryEntry] = waiting.entries if waiting else []
        self._waiter: asyncio.Future | None = None  # the stream waiting for an entry
        self.closed = False

    def add(self, event: TurnEvent) -> None:
        if event.finished or event.turn_id < 0:
            self.entries.append(event)
            self._wake()
            return
        n = len(event.token_ids)  # tokens sent on later (held back): rows, the text on the first
        if n:
            texts = [event.text, *[""] * (n - 1)]
            self.add_rows([event.session_id] * n, [event.turn_id] * n, [*event.token_ids], texts)

    def add_rows(
        self, session_ids: list[str], turn_ids: list[int], token_ids: list[int], texts: list[str]
    ) -> None:
        """Rows of one token each (parallel lists, copied)."""
        last = self.entries[-1] if self.entries else None
        if type(last) is tuple:  # merged into the rows just before: the order is kept
            last[0].extend(session_ids)
            last[1].extend(turn_ids)
            last[2].extend(token_ids)
            last[3].extend(texts)
        else:
            self.entries.append((list(session_ids), list(turn_ids), list(token_ids), list(texts)))
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
        return entries


class GatewayOutputs:
    def __init__(self, on_gone: Callable[[str], None] | None = None) -> None:
        self.on_gone = on_gone
        self._outboxes: dict[str, Outbox] = {}
        self._gone: LRUCache[str, bool] = LRUCache(MAX_GONE)
        self._closed = False
        self._failed: str | None = None

    def dispatch(self, outputs: Iterable[StepOutputs]) -> None:
        """Queue each record's events and rows for their gateways (those without one, or for a
        gateway that is gone, have no reader). A gateway that has not streamed yet gets an outbox
        now: it streams before its first turn's outputs matter, and they wait for it. Consumes
        the records."""
        for out in outputs:
            for event in out.events:
                outbox = self._outbox(event.gateway_id)
                if outbox is not None:
                    outbox.add(event)
            gateways = out.gateway_ids
            if not gateways:
                continue
            rows = (out.session_ids, out.turn_ids, out.token_ids, out.texts)
            if gateways.count(gateways[0]) == len(gateways):  # the common case: one gateway
                outbox = self._outbox(gateways[0])
                if outbox is not None:
                    outbox.add_rows(*rows)
                continue
            for gateway in dict.fromkeys(gateways):
                outbox = self._outbox(gateway)
                if outbox is not None:
                    at = [i for i, g in enumerate(gateways) if g == gateway]
                    outbox.add_rows(*([column[i] for i in at] for column in rows))

    def _outbox(self, gateway: str) -> Outbox | None:
        if not gateway or gateway in self._gone:
            return None
        outbox = self._outboxes.get(gateway)
        if outbox is None:
            outbox = self._outboxes[gateway] = Outbox()
        return outbox

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
