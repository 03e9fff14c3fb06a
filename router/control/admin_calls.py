"""``AdminCalls``: the router's AdminService calls that move sessions (mixed into
``SessionRouter``): DrainReplica (with or without migration), ResumeReplica and MigrateSession.
The work is ``router.control.drain``'s and ``router.control.migration``'s.

For autoscaling: ``drain(replica_id, migrate=True, timeout_s)`` answers ``Drained`` once the
replica holds no session (``sessions_left`` 0: it can be stopped), or after ``timeout_s`` with
how many are left; the replica stays DRAINING until ``resume`` (or its end).
"""

from __future__ import annotations

import dataclasses

from replica.api import ActorError
from router.control.api import Drained, ReplicaView, Route
from router.control.drain import Drainer


class AdminCalls:
    drainer: Drainer

    async def route(self, session_id: str, tenant: str | None = "") -> Route | ActorError:
        raise NotImplementedError  # provided by SessionRouter

    async def drain(
        self, replica_id: str, migrate: bool = False, timeout_s: float | None = None
    ) -> Drained | ActorError:
        """Drain a replica: it takes no new session; with ``migrate`` its sessions move to
        the other replicas, and the answer comes when it holds none or ``timeout_s`` (default
        ``drain_timeout_s``) has passed (``router.control.drain``)."""
        return await self.drainer.drain(replica_id, migrate, timeout_s)

    async def resume(self, replica_id: str) -> ReplicaView | ActorError:
        """Undo a drain: the replica takes new sessions again."""
        return await self.drainer.resume(replica_id)

    async def migrate_session(
        self, session_id: str, target_replica_id: str = "", wait_s: float | None = None
    ) -> Route | ActorError:
        """Move one session to ``target_replica_id`` (empty: placement chooses); a running
        turn ends first (waiting at most ``wait_s``, default ``drain_timeout_s``). Answers the
        session's new route, with its facts."""
        return await self.drainer.migrate_session(
            session_id, target_replica_id or None, wait_s, self.route, self._with_info
        )

    async def _with_info(self, route: Route | ActorError) -> Route | ActorError:
        """``route`` with the session's facts, read from its replica."""
        if isinstance(route, ActorError):
            return route
        info = await route.replica.get_session(session_id=route.session_id)
        return info if isinstance(info, ActorError) else dataclasses.replace(route, info=info)
