"""``Forks``: forking a session, and pinning the fork to the replica that holds its parent.

A fork's state is its parent's, shared in that replica's pools, so it is placed nowhere else: the
router routes the parent (waiting while it moves, refusing another tenant's session), asks that
replica to fork it and pins the child there with the parent's tenant. When the replica has no
room (its GPU and host tiers are full, or it drains) the fork waits for room as an open does (every
release and snapshot wakes it) up to ``open_timeout_s`` or the caller's deadline, then answers
RESOURCE_EXHAUSTED. A parent that moved between the route and the call is routed again.

A fork is idempotent per child id (the gateway chooses it); a caller that goes away abandons it
through ``Opener.abandon`` like an open, so an abandoned fork leaves no session behind.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from replica.api import ActorError, StatusCode
from router.control.api import Route
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.table import SessionTable

MAX_REROUTES = 3  # a parent moving again and again is answered UNAVAILABLE after this many


class Forks:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        sessions: SessionTable,
        route: Callable[[str, str], Awaitable[Route | ActorError]],
        opener: Opener,
        open_timeout_s: float,
    ) -> None:
        self.replicas = replicas
        self.sessions = sessions
        self.route = route
        self.opener = opener
        self.open_timeout_s = open_timeout_s

    async def fork(
        self, parent_id: str, child_id: str, tenant: str, gateway_id: str, wait_s: float | None
    ) -> Route | ActorError:
        """Fork ``parent_id`` (``tenant``'s) into ``child_id`` on the parent's replica."""
        wait = self.open_timeout_s if wait_s is None else min(wait_s, self.open_timeout_s)
        deadline, reroutes = time.monotonic() + wait, 0
        while True:
            if self.opener.abandoned(child_id):
                return ActorError(StatusCode.CANCELLED, "the caller of this fork went away")
            route = await self.route(parent_id, tenant)
            if isinstance(route, ActorError):
                return route
            forked = await self._fork_on(route, child_id, gateway_id)
            if not isinstance(forked, ActorError):
                if self.opener.abandoned(child_id):
                    await self.opener.abandon(child_id)  # landed after its caller left
                    return ActorError(StatusCode.CANCELLED, "the caller of this fork went away")
                return forked
            moved = self.sessions.get(parent_id)
            if (
                forked.code == StatusCode.NOT_FOUND
                and moved
                and moved.replica_id != route.replica_id
            ):
                reroutes += 1
                if reroutes > MAX_REROUTES:
                    return ActorError(StatusCode.UNAVAILABLE, "the session keeps moving; retry")
                continue
            if forked.code != StatusCode.RESOURCE_EXHAUSTED:
                return forked
            left = deadline - time.monotonic()
            if left <= 0:
                return ActorError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"no room on replica {route.replica_id}, which holds the session's state, "
                    f"to fork it: {forked.message}",
                )
            await self.opener.wait_for_room(left)

    async def _fork_on(self, parent: Route, child_id: str, gateway_id: str) -> Route | ActorError:
        entry = self.replicas[parent.replica_id]
        entry.reserved += 1  # in flight: not in any snapshot yet
        try:
            opened = await entry.replica.fork_session(
                parent_id=parent.session_id, child_id=child_id, gateway_id=gateway_id
            )
        except Exception as exc:  # noqa: BLE001 - the replica died under us
            opened = ActorError(StatusCode.UNAVAILABLE, f"fork_session failed: {exc}; retry")
        finally:
            entry.reserved -= 1
        if isinstance(opened, ActorError):
            return opened
        entry.take(opened.snapshot)
        self.sessions.pin(child_id, parent.replica_id, parent.tenant)
        return Route(child_id, parent.replica_id, entry.handle, opened.info, parent.tenant)
