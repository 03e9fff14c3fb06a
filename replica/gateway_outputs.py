"""``GatewayOutputs``: each gateway's queue of turn events on one replica.

Token delivery costs no Ray round trip per token: each gateway keeps one long-lived streaming
call per replica (``ReplicaActor.stream_outputs``), and every item is everything the engine
produced for that gateway's sessions since the gateway's last item (tokens, finishes, errors).
A turn's events go to the gateway that submitted it (``TurnEvent.gateway_id``). Used on the
actor's event loop only.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

from replica.api import StatusCode, TurnEvent, replica_lost_message


class GatewayOutputs:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue] = defaultdict(asyncio.Queue)

    def dispatch(self, events: Iterable[TurnEvent]) -> None:
        """Queue each event for its gateway (events without one have no reader)."""
        by_gateway: dict[str, list[TurnEvent]] = defaultdict(list)
        for event in events:
            if event.gateway_id:
                by_gateway[event.gateway_id].append(event)
        for gateway, batch in by_gateway.items():
            self._queues[gateway].put_nowait(batch)

    def abort_sessions(self, gateways: dict[str, str]) -> None:
        """The replica is dead: end the call of every session (id -> its gateway) with ABORTED."""
        self.dispatch(
            TurnEvent(
                sid,
                -1,
                error_code=StatusCode.ABORTED,
                error=replica_lost_message(sid),
                gateway_id=gateway,
            )
            for sid, gateway in gateways.items()
        )

    async def stream(self, gateway_id: str) -> AsyncIterator[list[TurnEvent]]:
        """``gateway_id``'s items, forever: steps it has not taken yet are coalesced."""
        queue = self._queues[gateway_id]
        while True:
            batch = await queue.get()
            while not queue.empty():
                batch.extend(queue.get_nowait())
            yield batch
