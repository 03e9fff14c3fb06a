"""``Routing``: where a session lives, for the caller asking, and its facts read from there.

A route asked for while its session moves (migration, failover) waits for the move, then reads
the table again. A session the table does not know is NOT_FOUND; one lost with its replica is
ABORTED; another tenant's is PERMISSION_DENIED (a ``tenant`` of None is an admin's: any tenant).
"""

from __future__ import annotations

import asyncio
import dataclasses

from replica.api import ActorError, StatusCode, clip_id, replica_lost_message
from router.control.api import Route
from router.control.registry import ReplicaRegistry
from router.control.table import SessionState, SessionTable


class Routing:
    def __init__(self, replicas: ReplicaRegistry, sessions: SessionTable) -> None:
        self.replicas = replicas
        self.sessions = sessions

    async def route(self, session_id: str, tenant: str | None = "") -> Route | ActorError:
        """Where the session lives (waiting while it moves), for ``tenant``."""
        session = self.sessions.get(session_id)
        while session is not None and session.moving is not None and not session.moving.done():
            await asyncio.shield(session.moving)
            session = self.sessions.get(session_id)
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

    async def with_info(self, route: Route | ActorError) -> Route | ActorError:
        """``route`` with the session's facts, read from its replica."""
        if isinstance(route, ActorError):
            return route
        info = await route.replica.get_session(session_id=route.session_id)
        return info if isinstance(info, ActorError) else dataclasses.replace(route, info=info)

    async def route_with_info(self, session_id: str, tenant: str | None) -> Route | ActorError:
        """``route``, with the session's facts (a retried open or fork answers this way)."""
        return await self.with_info(await self.route(session_id, tenant))
