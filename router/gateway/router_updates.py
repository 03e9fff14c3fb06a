"""``RouterUpdates``: what a gateway tells the router about sessions it opened or released on a
replica itself, batched (``router.gateway.batching``): one ``update_sessions`` call in flight at a
time carries every pin, forget and fresh replica snapshot that arrived meanwhile.

A pin is acknowledged (the open's reply waits for it, so that the session can be continued
through any other gateway the moment its client hears of it); a forget and a snapshot are not
(the router learns the same from the replica's next report anyway).
"""

from __future__ import annotations

import asyncio
from typing import Any

from replica.api import ActorError, PoolSnapshot
from router.control.client import RouterClient
from router.gateway.batching import CallBatcher

PIN, FORGET, SNAPSHOT = "pin", "forget", "snapshot"


class RouterUpdates:
    def __init__(self, router: RouterClient) -> None:
        self.router = router
        self.batcher = CallBatcher(self._send)

    async def _send(self, requests: list[tuple[str, Any]]) -> list[Any] | ActorError:
        pins = [args for kind, args in requests if kind == PIN]
        forgets = [args for kind, args in requests if kind == FORGET]
        newest: dict[str, PoolSnapshot] = {}
        for kind, snap in requests:
            if kind == SNAPSHOT and (
                snap.replica_id not in newest or snap.seq > newest[snap.replica_id].seq
            ):
                newest[snap.replica_id] = snap
        pinned = await self.router.update_sessions(
            pins=pins, forgets=forgets, snapshots=list(newest.values())
        )
        if isinstance(pinned, ActorError):
            return pinned
        answers = iter(pinned)
        return [next(answers) if kind == PIN else None for kind, _ in requests]

    def pin(
        self, session_id: str, replica_id: str, tenant: str, blank_idle_s: float | None = None
    ) -> asyncio.Future:
        """Pin a session opened on ``replica_id`` (``blank_idle_s``: opened empty, with this idle
        timeout, which a failover may open again); the future of whether it was pinned (False:
        the router does not know that replica as a live one, so the session must not be kept),
        or of an ``ActorError``."""
        return self.batcher.submit((PIN, (session_id, replica_id, tenant, blank_idle_s)))

    def forget(
        self, session_id: str, replica_id: str, snapshot: PoolSnapshot | None = None
    ) -> asyncio.Future:
        """A session released on ``replica_id`` (with the replica's snapshot right after, when
        known); the future of the call that carries it. The router keeps a session that is
        pinned to another replica by now (it moved there)."""
        if snapshot is not None:
            self.batcher.submit((SNAPSHOT, snapshot))
        return self.batcher.submit((FORGET, (session_id, replica_id)))

    def snapshot(self, snapshot: PoolSnapshot) -> None:
        """A replica's fresh snapshot (from an open's reply), for the router's placement."""
        self.batcher.submit((SNAPSHOT, snapshot))
