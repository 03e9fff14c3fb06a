"""``Following``: the gateway's calls to a session's replica, following the session when it moves.

A gateway caches each session's route, so after a migration (drain, MigrateSession) or a
failover its cached route may name a replica the session has left. Such a replica answers
UNAVAILABLE while the session is moving away (``Closed.moving`` for a close), NOT_FOUND once it
has gone, or has died. Each of these makes the gateway drop the cached route and ask the router,
which waits while the session moves and answers where it is now; the call is then made there.
The client sees none of it: a turn that arrives while its session moves waits and runs on the
new replica. Only when the router, too, no longer knows the session (NOT_FOUND) or knows its
state is gone (ABORTED) is that the answer. Mixed into ``Gateway``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ActorError, ReleaseReason, StatusCode
from router.control.table import Route
from router.gateway.background import Background
from router.gateway.convert import Refused, check
from router.gateway.route_cache import RouteCache
from router.gateway.router_client import RouterClient

log = logging.getLogger(__name__)

MAX_FOLLOWS = 8  # a session that moves more often than this during one call: retry
STILL_MOVING_S = 0.05  # the router has re-pinned the session; its old replica not unmarked yet
FOLLOWED = (StatusCode.UNAVAILABLE, StatusCode.NOT_FOUND)


class Following:
    routes: RouteCache
    router: RouterClient
    background: Background

    async def replica_lost(self, replica_id: str, why: str) -> None:  # provided by Gateway
        raise NotImplementedError

    async def relocate(self, route: Route) -> Route | ActorError:
        """Where ``route``'s session is now, asked of the router (which waits while it moves)."""
        self.routes.drop(route.session_id)
        return await self.routes.lookup(route.session_id, route.tenant)

    async def on_session(
        self, route: Route, what: str, make: Callable[[Route], Awaitable[Any]]
    ) -> tuple[Route, Any]:
        """``make(route)`` (an actor call named ``what`` about ``route``'s session), made where
        the session is: returns the route that answered and its result; refusals are raised as
        ``Refused``."""
        for _ in range(MAX_FOLLOWS):
            try:
                result = await make(route)
            except Exception as exc:  # noqa: BLE001 - the replica died
                await self.replica_lost(route.replica_id, f"{what} failed: {type(exc).__name__}")
                result = ActorError(StatusCode.UNAVAILABLE, f"replica {route.replica_id} died")
            if not (isinstance(result, ActorError) and result.code in FOLLOWED):
                return route, check(result)
            moved = check(await self.relocate(route))
            if moved.replica_id == route.replica_id:
                if result.code == StatusCode.NOT_FOUND:
                    raise Refused(result.code, result.message)
                await asyncio.sleep(STILL_MOVING_S)
            route = moved
        raise Refused(StatusCode.UNAVAILABLE, "the session kept moving during the call; retry")

    async def release(self, route: Route, reason: ReleaseReason) -> bool:
        """Release a session where it is, straight away, then tell the router (off the reply's
        path); returns whether it was open."""
        for _ in range(MAX_FOLLOWS):
            self.routes.drop(route.session_id)
            try:
                closed = await route.handle.close_sessions.remote([route.session_id], reason)
            except Exception as exc:  # noqa: BLE001 - the replica is gone: ask where it went
                log.warning("release of %s failed: %s", route.session_id, exc)
                closed = None
            closed = None if isinstance(closed, ActorError) else closed
            if closed is not None and closed.was_open[0]:
                break
            moved = await self.relocate(route)
            if isinstance(moved, ActorError) or (
                moved.replica_id == route.replica_id and not (closed and closed.moving)
            ):
                break  # not open anywhere (or it was, there, and is released now)
            if moved.replica_id == route.replica_id:
                await asyncio.sleep(STILL_MOVING_S)
            route = moved
        snapshot = closed.snapshot if closed else None
        self.background.spawn(
            self.router.call("forget", [route.session_id], snapshot, route.replica_id)
        )
        self.routes.drop(route.session_id)
        return bool(closed and closed.was_open[0])
