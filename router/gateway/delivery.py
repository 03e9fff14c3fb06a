"""``Delivery``: turn events from the replicas to this gateway's calls.

Token delivery costs no Ray round trip per token: for each replica the gateway keeps one
long-lived ``stream_outputs`` call whose items carry everything the engine produced for this
gateway's sessions since the last item (``replica.api.DeliveryEntry``); the pump hands each entry
to the inbox of its session (``router.gateway.inbox``), if a call of this gateway streams that
session now, and does nothing else per token. When a replica's stream breaks,
``on_lost(replica_id, why)`` is called; ``abort_replica`` then ends every waiting call of that
replica's sessions with ABORTED, so no client hangs on a turn that will never end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from replica.api import StatusCode, TurnEvent, replica_lost_message
from router.control.table import Route
from router.gateway.inbox import Inbox

log = logging.getLogger(__name__)


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
        inboxes = self._inboxes
        try:
            async for ref in route.handle.stream_outputs.remote(self.gateway_id):
                for entry in await ref:
                    sid = entry[0] if type(entry) is list else entry.session_id
                    inbox = inboxes.get(sid)
                    if inbox is not None:
                        inbox.put(entry)
            log.info("replica %s shut down: its output stream ended", route.replica_id)
            self.abort_replica(route.replica_id)  # nothing should wait on it; nothing will
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died
            log.error("output stream of replica %s broke: %s", route.replica_id, exc)
            await self.on_lost(route.replica_id, f"output stream broke: {type(exc).__name__}")

    def abort_replica(self, replica_id: str) -> None:
        """End the calls streaming sessions of a dead replica: their state is gone."""
        for inbox in [i for i in self._inboxes.values() if i.replica_id == replica_id]:
            sid = inbox.session_id
            inbox.put(
                TurnEvent(sid, -1, error_code=StatusCode.ABORTED, error=replica_lost_message(sid))
            )

    def stop(self) -> None:
        for task in self._pumps.values():
            task.cancel()
