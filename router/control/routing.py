"""``Routing``: where a session lives, for the caller asking, and its facts read from there.

A route asked for while its session moves (migration, failover) waits for the move, then reads
the table again; one pinned to a replica declared dead waits for that replica's failover. A
session the table does not know is NOT_FOUND; one lost with its replica is ABORTED; another
tenant's is PERMISSION_DENIED (a ``tenant`` of None is an admin's: any tenant).

A router starts (or Ray restarts it) with an empty table that the replicas fill as they register
with their sessions, and the controller hands it the replicas that died unknown to it
(``LostReplicas``). Until the controller says every replica it knows is accounted for
(``accounted``), a session the table does not know may be on its way: its route waits for that
(at most ``REBUILD_WAIT_S``) before it is NOT_FOUND.
"""

from __future__ import annotations

import asyncio
import dataclasses

from replica.api import ActorError, StatusCode, clip_id, replica_lost_message
from router.control.api import ReplicaHealth, Route
from router.control.registry import ReplicaRegistry
from router.control.table import SessionEntry, SessionState, SessionTable

REBUILD_WAIT_S = 15.0


class Routing:
    def __init__(self, replicas: ReplicaRegistry, sessions: SessionTable) -> None:
        self.replicas = replicas
        self.sessions = sessions
        self._accounted = asyncio.Event()

    def accounted(self) -> None:
        """Every replica the controller knows is in the table, or handed over (idempotent)."""
        self._accounted.set()

    async def route(self, session_id: str, tenant: str | None = "") -> Route | ActorError:
        """Where the session lives (waiting while it moves), for ``tenant``."""
        session = await self._settled(session_id)
        if session is None and not self._accounted.is_set():
            try:
                await asyncio.wait_for(self._accounted.wait(), REBUILD_WAIT_S)
            except asyncio.TimeoutError:
                pass
            session = await self._settled(session_id)
        if session is None:
            return ActorError(
                StatusCode.NOT_FOUND, f"session {clip_id(session_id)} is not open; open a new one"
            )
        if session.state == SessionState.ABORTED:
            return ActorError(StatusCode.ABORTED, replica_lost_message(session_id))
        if tenant is not None and session.tenant and session.tenant != tenant:
            return ActorError(
                StatusCode.PERMISSION_DENIED,
                f"session {clip_id(session_id)} belongs to another tenant",
            )
        entry = self.replicas[session.replica_id]
        return Route(session_id, session.replica_id, entry.handle, tenant=session.tenant)

    async def _settled(self, session_id: str) -> SessionEntry | None:
        """The session's entry once it is not moving and its replica's failover (if it was
        declared dead) has ended."""
        while (session := self.sessions.get(session_id)) is not None:
            if session.moving is not None and not session.moving.done():
                await asyncio.shield(session.moving)
                continue
            entry = self.replicas.get(session.replica_id)
            dead = entry is not None and entry.health == ReplicaHealth.DEAD
            failover = entry.failover if dead else None
            if failover is None or failover.done():
                return session
            await asyncio.wait([failover])
        return None

    async def with_info(self, route: Route | ActorError) -> Route | ActorError:
        """``route`` with the session's facts, read from its replica."""
        if isinstance(route, ActorError):
            return route
        info = await route.replica.get_session(session_id=route.session_id)
        return info if isinstance(info, ActorError) else dataclasses.replace(route, info=info)

    async def route_with_info(self, session_id: str, tenant: str | None) -> Route | ActorError:
        """``route``, with the session's facts (a retried open or fork answers this way)."""
        return await self.with_info(await self.route(session_id, tenant))
