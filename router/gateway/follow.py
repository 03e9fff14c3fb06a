"""``Follower``: the gateway's calls to a session's replica, following the session when it moves.

A gateway caches each session's route, so after a migration (drain, MigrateSession) or a
failover its cached route may name a replica the session has left. Such a replica answers
UNAVAILABLE while the session is moving away (``Closed.moving`` for a close), NOT_FOUND once it
has gone, or has died. Each of these makes the gateway drop the cached route and ask the router,
which waits while the session moves and answers where it is now; the call is then made there.
The client sees none of it: a turn that arrives while its session moves waits and runs on the
new replica. Only when the router, too, no longer knows the session (NOT_FOUND) or knows its
state is gone (ABORTED) is that the answer. A replica found dead on the way is reported lost
(``Delivery.replica_lost``: the calls streaming its sessions follow them too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ActorError, ReleaseReason, StatusCode
from router.call_errors import CallFailure, FailureKind, log_failure, retrying
from router.control.api import Route
from router.gateway.background import Background
from router.gateway.cluster_view import ClusterView
from router.gateway.convert import Refused, check
from router.gateway.delivery import Delivery
from router.gateway.gateway_metrics import GatewayMetrics
from router.gateway.replica_calls import ReplicaCallsByReplica
from router.gateway.route_cache import RouteCache
from router.gateway.router_updates import RouterUpdates

log = logging.getLogger(__name__)

MAX_FOLLOWS = 8  # a session that moves more often than this during one call: retry
# the router pins the session where a replica still refuses it as moving (a move settling, or
# one a router restart cut off, which the replica gives back once every replica has registered
# with the new router): wait this long, doubling each time up to the cap, before asking again
STILL_MOVING_S = 0.05
STILL_MOVING_MAX_S = 2.0
FOLLOWED = (StatusCode.UNAVAILABLE, StatusCode.NOT_FOUND)


class Follower:
    def __init__(
        self,
        routes: RouteCache,
        calls: ReplicaCallsByReplica,
        cluster: ClusterView,
        updates: RouterUpdates,
        delivery: Delivery,
        background: Background,
        metrics: GatewayMetrics,
    ) -> None:
        self.routes = routes
        self.calls = calls
        self.cluster = cluster
        self.updates = updates
        self.delivery = delivery
        self.background = background
        self.metrics = metrics

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
        for follow in range(MAX_FOLLOWS):
            try:
                result = await retrying(lambda r=route: make(r))
            except Exception as exc:  # noqa: BLE001 - read by kind: only a dead replica is lost
                failure = self.call_failed(what, route.replica_id, exc)
                if failure.kind is not FailureKind.DEAD:
                    raise Refused(failure.status(), failure.message()) from None
                await self.delivery.replica_lost(
                    route.replica_id, f"{what} failed: {failure.cause}"
                )
                result = ActorError(StatusCode.UNAVAILABLE, f"replica {route.replica_id} died")
            if not (isinstance(result, ActorError) and result.code in FOLLOWED):
                return route, check(result)
            moved = check(await self.relocate(route))
            if moved.replica_id == route.replica_id:
                if result.code == StatusCode.NOT_FOUND:
                    raise Refused(result.code, result.message)
                await asyncio.sleep(min(STILL_MOVING_S * 2**follow, STILL_MOVING_MAX_S))
            route = moved
        raise Refused(StatusCode.UNAVAILABLE, "the session kept moving during the call; retry")

    async def release(self, route: Route, reason: ReleaseReason) -> bool:
        """Release a session where it is, straight away, then tell the router (off the reply's
        path); returns whether it was open."""
        for _ in range(MAX_FOLLOWS):
            self.routes.drop(route.session_id)
            calls = self.calls.of(route.replica_id, route.handle)
            try:
                closed = await calls.close(route.session_id, reason)
            except Exception as exc:  # noqa: BLE001 - logged, counted: ask where it is
                self.call_failed("close_sessions", route.replica_id, exc)
                closed = None
            closed = None if isinstance(closed, ActorError) else closed
            if closed is not None:
                self.cluster.note(closed.snapshot)
                if closed.was_open:
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
        self.background.spawn(self.updates.forget(route.session_id, route.replica_id, snapshot))
        self.routes.drop(route.session_id)
        return bool(closed and closed.was_open)

    def call_failed(self, method: str, replica_id: str, exc: BaseException) -> CallFailure:
        """A call of this gateway to a replica raised: read, logged once and counted."""
        failure = CallFailure.of(method, f"replica {replica_id}", exc)
        log_failure(log, failure)
        self.metrics.replica_call_failed(method, failure.kind.value)
        return failure
