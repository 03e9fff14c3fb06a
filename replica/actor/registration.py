"""``Registration``: what a replica tells a router that does not know it (a restarted router).

``arguments()`` are ``register_replica``'s arguments after the replica id: its handle, its
description, the sessions it holds and their tenants, its latest snapshot, its checkpoint
store's handle, those of its sessions that hold nothing yet with their idle timeouts, and those
marked moving out (a move the router's death cut off). The router rebuilds its table from them
(``replica.actor.reporting.RouterReporter`` sends them).
"""

from __future__ import annotations

import ray

from replica.actor.checkpoints import CheckpointCalls
from replica.actor.engine_host import EngineHost
from replica.actor.sessions import SessionCalls
from replica.actor.status import ReplicaStatus


class Registration:
    def __init__(
        self,
        status: ReplicaStatus,
        sessions: SessionCalls,
        host: EngineHost,
        checkpoints: CheckpointCalls,
    ) -> None:
        self.status = status
        self.sessions = sessions
        self.host = host
        self.checkpoints = checkpoints

    async def arguments(self) -> tuple | None:
        """``(handle, description, tenants, snapshot, checkpoint store, blank sessions, moving
        sessions)``, read on the actor's event loop (the actor's own handle is Ray's runtime
        context's); None while checkpoints are on and no store has followed this replica yet: a
        replica starting up is registered by the serve process with its new store, and one that
        registered itself without would be HEALTHY, taking sessions whose failover finds no
        store to restore them from."""
        if self.checkpoints.outbox is not None and self.checkpoints.store is None:
            return None
        return (
            ray.get_runtime_context().current_actor,
            await self.status.describe(),
            await self.sessions.list_sessions(),
            await self.host.latest_snapshot(),
            self.checkpoints.store,
            await self.sessions.blank_sessions(),
            await self.sessions.moving_sessions(),
        )
