"""``Delivery``: turn events from the replicas to this gateway's calls.

Token delivery costs no Ray round trip per token: for each replica the gateway keeps one
long-lived ``stream_outputs`` call whose items carry everything the engine produced for this
gateway's sessions since the last item (``replica.api.DeliveryEntry``); the pump hands each entry
to the inbox of its session (``router.gateway.inbox``), if a call of this gateway streams that
session now, and does nothing else per token. When a replica's stream breaks,
``on_lost(replica_id, why)`` is called; when it ends (the replica shut down),
``on_ended(replica_id)``. The gateway then ends every waiting call of that replica's sessions
(``router.gateway.follow``), so no client hangs on a turn that will never end. A call whose
session moved (``move``) waits on its new replica; news of the old one no longer concerns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from router.control.api import Route
from router.gateway.inbox import Inbox

log = logging.getLogger(__name__)


class Delivery:
    def __init__(
        self,
        gateway_id: str,
        on_lost: Callable[[str, str], Awaitable[None]],
        on_ended: Callable[[str], Awaitable[None]],
    ) -> None:
        self.gateway_id = gateway_id
        self.on_lost = on_lost
        self.on_ended = on_ended
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
            inbox.left.add(inbox.replica_id)
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
        inboxes = self._inboxes
        try:
            async for ref in route.replica.stream_outputs(gateway_id=self.gateway_id):
                for entry in await ref:
                    sid = entry[0] if type(entry) is list else entry.session_id
                    inbox = inboxes.get(sid)
                    if inbox is not None:
                        inbox.put(entry)
            await self.on_ended(route.replica_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died
            log.error("output stream of replica %s broke: %s", route.replica_id, exc)
            await self.on_lost(route.replica_id, f"output stream broke: {type(exc).__name__}")

    def streaming_on(self, replica_id: str) -> list[Inbox]:
        """The inboxes of this gateway's calls streaming sessions of ``replica_id``, now or
        before their session moved (a turn may still run there)."""
        return [
            inbox
            for inbox in self._inboxes.values()
            if inbox.replica_id == replica_id or replica_id in inbox.left
        ]

    def stop(self) -> None:
        for task in self._pumps.values():
            task.cancel()
