"""``GatewayOutputs``: what the engine produced for each gateway, until that gateway takes it.

Token delivery costs no Ray round trip per token: each gateway keeps one long-lived streaming
call per replica (``ReplicaActor.stream_outputs``), and every item is everything produced for that
gateway's sessions since its last item. The stream follows its reader: Ray holds the generator
while the gateway has not consumed its previous items (``STREAM_BACKPRESSURE`` of them), and what
the engine produces meanwhile is merged into the next item (flow control, not timers), so a busy
gateway gets fewer, larger items instead of a growing queue. A stream is read on a thread of its
own (``stream``, a plain generator: ``replica.actor.stream_threads``) or, when no such thread is
free, on the event loop (``stream_async``).

An item is a list of entries in the order the engine produced them (``replica.api.TokenRows``: the
rows of the engine's ``StepOutputs`` for that gateway's sessions, one token of one turn each, the
rows of consecutive steps merged into one entry; a ``TurnEvent`` for the last event of a turn and
events about a session). A record's rows are split by gateway only when they go to more than one:
a step of one gateway's turns costs the same calls here whatever their number. A turn's outputs
go to the gateway that submitted it (``gateway_id``). When a gateway's stream ends (the gateway
stopped, or died: Ray ends the generator of a caller that is gone, a plain one at its next
``yield``, so one with nothing to send yields an empty item every ``HEARTBEAT_S``), its outbox
goes and ``on_gone(gateway_id)`` is called (on the thread the stream ran on); outputs for it are
dropped from then on, until it streams again; ``release_streams_of`` then releases the sessions
its Converse streams held open, which ended with it. A newer stream of a gateway takes over the
entries still waiting, and the older one ends. When the engine dies, ``fail`` ends every stream
with an error, as the death of the replica's process would: each gateway then asks the router
what became of the replica's sessions (restored elsewhere from their checkpoints, or gone);
``close`` (the replica shuts down) ends them quietly. ``dispatch``, ``close`` and ``fail`` run on
the actor's event loop, the streams on their threads or the loop, all under one lock;
``release_streams_of`` runs on the engine thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from cachetools import LRUCache

from replica.actor.gateway_outbox import Outbox
from replica.api import DeliveryEntry, ReleaseReason

if TYPE_CHECKING:
    from replica.engine.engine import Engine
    from replica.engine.step_outputs import StepOutputs

STREAM_BACKPRESSURE = 2  # items Ray lets a gateway leave unconsumed before the stream waits
MAX_GONE = 10_000  # gateways remembered as gone (least recently gone forgotten first)
HEARTBEAT_S = 1.0  # a stream on a thread with nothing to send yields an empty item this often


class ReplicaFailedError(RuntimeError):
    """The replica's engine died: its output streams end with this."""


class GatewayOutputs:
    def __init__(self, on_gone: Callable[[str], None] | None = None) -> None:
        """``on_gone(gateway_id)``: a gateway's stream ended (called where that stream ran)."""
        self.on_gone = on_gone
        # every outbox's lock; a stream on a thread waits on its own outbox's condition over it,
        # so a step's outputs wake their gateways' streams only, never every idle one
        self._lock = threading.RLock()
        self._outboxes: dict[str, Outbox] = {}
        self._gone: LRUCache[str, bool] = LRUCache(MAX_GONE)
        self._closed = False
        self._failed: str | None = None

    def dispatch(self, outputs: Iterable[StepOutputs]) -> None:
        """Queue each record's events and rows for their gateways (those without one, or for a
        gateway that is gone, have no reader). A gateway that has not streamed yet gets an outbox
        now: it streams before its first turn's outputs matter, and they wait for it. Consumes
        the records."""
        with self._lock:
            for out in outputs:
                self._dispatch(out)

    def _dispatch(self, out: StepOutputs) -> None:
        for event in out.events:
            outbox = self._outbox(event.gateway_id)
            if outbox is not None:
                outbox.add(event)
        gateways = out.gateway_ids
        if not gateways:
            return
        rows = (out.session_ids, out.turn_ids, out.token_ids, out.texts)
        if gateways.count(gateways[0]) == len(gateways):  # the common case: one gateway
            outbox = self._outbox(gateways[0])
            if outbox is not None:
                outbox.add_rows(*rows)
            return
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
            outbox = self._outboxes[gateway] = Outbox(self._lock)
        return outbox

    def stream(self, gateway_id: str) -> Iterator[list[DeliveryEntry]]:
        """On the stream's own thread: ``gateway_id``'s items until the stream is closed or a
        newer one takes over (an empty item after ``HEARTBEAT_S`` with nothing to send)."""
        outbox = self._attach(gateway_id, None)
        try:
            while True:
                with self._lock:
                    if outbox.ended:
                        break
                    entries = outbox.take(HEARTBEAT_S)
                    if outbox.superseded:
                        break
                yield entries
            if self._failed is not None and not outbox.superseded:
                raise ReplicaFailedError(self._failed)
        finally:
            self._detach(gateway_id, outbox)

    async def stream_async(self, gateway_id: str) -> AsyncIterator[list[DeliveryEntry]]:
        """On the event loop: ``stream``'s items (Ray closes this generator when its caller is
        gone, so none is empty)."""
        outbox = self._attach(gateway_id, asyncio.get_running_loop())
        try:
            while True:
                with self._lock:
                    if outbox.ended:
                        break
                    later = outbox.take_later()
                    entries = outbox.taken() if later is None else None
                if later is not None:
                    await later
                elif entries:
                    yield entries
            if self._failed is not None and not outbox.superseded:
                raise ReplicaFailedError(self._failed)
        finally:
            self._detach(gateway_id, outbox)

    def _attach(self, gateway_id: str, loop: asyncio.AbstractEventLoop | None) -> Outbox:
        """A stream of ``gateway_id`` begins: its outbox, with the entries waiting for it (an
        older stream's end, which leaves them)."""
        with self._lock:
            self._gone.pop(gateway_id, None)
            older = self._outboxes.get(gateway_id)
            if older is not None:
                older.close(superseded=True)
            outbox = self._outboxes[gateway_id] = Outbox(self._lock, older, loop)
            if self._closed:
                outbox.close()
            return outbox

    def _detach(self, gateway_id: str, outbox: Outbox) -> None:
        """A stream of ``gateway_id`` ended: unless a newer one took over, the gateway is gone."""
        with self._lock:
            ours = self._outboxes.get(gateway_id) is outbox
            if ours:
                del self._outboxes[gateway_id]
                self._gone[gateway_id] = True
        if ours and self.on_gone is not None and not self._closed:
            self.on_gone(gateway_id)

    def close(self) -> None:
        """The replica shuts down: every stream ends (its gateway's pump ends quietly)."""
        with self._lock:
            self._closed = True
            for outbox in self._outboxes.values():
                outbox.close()

    def fail(self, why: str) -> None:
        """The engine died: every stream, now and later, ends with ``ReplicaFailedError(why)``
        once it has handed out what the engine produced before."""
        with self._lock:
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
