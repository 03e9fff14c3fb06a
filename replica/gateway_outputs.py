"""``GatewayOutputs``: each gateway's queue of turn events on one replica.

Token delivery costs no Ray round trip per token: each gateway keeps one long-lived streaming
call per replica (``ReplicaActor.stream_outputs``), and every item is everything the engine
produced for that gateway's sessions since the gateway's last item (tokens, finishes, errors).
A turn's events go to the gateway that submitted it (``TurnEvent.gateway_id``). When the engine
dies, ``fail`` ends every stream with an error, as the death of the replica's process would: each
gateway then asks the router what became of the replica's sessions (restored elsewhere from
their checkpoints, or gone). Used on the actor's event loop only.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

from replica.api import TurnEvent


class ReplicaFailedError(RuntimeError):
    """The replica's engine died: its output streams end with this."""


class GatewayOutputs:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue] = defaultdict(asyncio.Queue)
        self._failed: str | None = None

    def dispatch(self, events: Iterable[TurnEvent]) -> None:
        """Queue each event for its gateway (events without one have no reader)."""
        by_gateway: dict[str, list[TurnEvent]] = defaultdict(list)
        for event in events:
            if event.gateway_id:
                by_gateway[event.gateway_id].append(event)
        for gateway, batch in by_gateway.items():
            self._queues[gateway].put_nowait(batch)

    def fail(self, why: str) -> None:
        """End every stream, now and later, with ``ReplicaFailedError(why)``."""
        self._failed = why
        for queue in self._queues.values():
            queue.put_nowait(None)

    async def stream(self, gateway_id: str) -> AsyncIterator[list[TurnEvent]]:
        """``gateway_id``'s items, forever: steps it has not taken yet are coalesced."""
        queue = self._queues[gateway_id]
        while True:
            batch = None if self._failed else await queue.get()
            while batch is not None and not queue.empty():
                more = queue.get_nowait()
                batch = None if more is None else batch + more
            if batch is None:
                raise ReplicaFailedError(self._failed)
            yield batch
