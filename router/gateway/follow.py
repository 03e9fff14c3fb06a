"""``Following``: the gateway's calls to a session's replica, following the session when it moves.

A gateway caches each session's route, so after a migration (drain, MigrateSession) or a
failover its cached route may name a replica the session has left. Such a replica answers
UNAVAILABLE while the session is moving away (``Closed.moving`` for a close), NOT_FOUND once it
has gone, or has died. Each of these makes the gateway drop the cached route and ask the router,
which waits while the session moves and answers where it is now; the call is then made there.
The client sees none of it: a turn that arrives while its session moves waits and runs on the
new replica. Only when the router, too, no longer knows the session (NOT_FOUND) or knows its
state is gone (ABORTED) is that the answer.

The calls streaming a session follow it too when its old replica ends: one that died
(``replica_lost``: the router's failover says which sessions were restored elsewhere from their
checkpoints) or one that was drained and stopped (``replica_ended``, autoscaling). Each call
streaming a session from it gets ``router.gateway.inbox.ReplicaLost``: where the session goes
on elsewhere (restored, or moved off before), at its committed tokens, a turn in flight there
ends UNAVAILABLE (Generate: retry it) or INTERRUPTED (Converse, which goes on); where its state is
gone, ABORTED. Mixed into ``Gateway``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ActorError, ReleaseReason, StatusCode
from router.call_errors import CallFailure, FailureKind, log_failure, retrying
from router.control.api import Route
from router.control.client import RouterClient
from router.gateway.background import Background
from router.gateway.cluster_view import ClusterView
from router.gateway.convert import Refused, check
from router.gateway.delivery import Delivery
from router.gateway.inbox import ReplicaLost
from router.gateway.metrics import GatewayMetrics
from router.gateway.replica_calls import ReplicaCallsByReplica
from router.gateway.route_cache import RouteCache
from router.gateway.router_updates import RouterUpdates

log = logging.getLogger(__name__)

MAX_FOLLOWS = 8  # a session that moves more often than this during one call: retry
STILL_MOVING_S = 0.05  # the router has re-pinned the session; its old replica not unmarked yet
FOLLOWED = (StatusCode.UNAVAILABLE, StatusCode.NOT_FOUND)


class Following:
    routes: RouteCache
    router: RouterClient
    background: Background
    calls: ReplicaCallsByReplica
    cluster: ClusterView
    updates: RouterUpdates
    delivery: Delivery
    metrics: GatewayMetrics

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
                result = await retrying(lambda r=route: make(r))
            except Exception as exc:  # noqa: BLE001 - read by kind: only a dead replica is lost
                failure = self.call_failed(what, route.replica_id, exc)
                if failure.kind is not FailureKind.DEAD:
                    raise Refused(failure.status(), failure.message()) from None
                await self.replica_lost(route.replica_id, f"{what} failed: {failure.cause}")
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

    # ----- replicas that end ------------------------------------------------------------------

    async def replica_lost(self, replica_id: str, why: str) -> None:
        """This gateway saw a replica fail: tell the router, then end the calls streaming its
        sessions here as the router's failover says (restored elsewhere, or gone)."""
        self._forget_calls(replica_id)
        outcome = await self.router.replica_failed(replica_id=replica_id, why=why)
        await self._end_streams_on(
            replica_id, {} if isinstance(outcome, ActorError) else outcome.restored
        )

    async def replica_ended(self, replica_id: str) -> None:
        """A replica's output stream ended: it shut down (drained and stopped), so the sessions
        still streamed from it here had moved away, or are gone with it."""
        log.info("replica %s shut down: its output stream ended", replica_id)
        self._forget_calls(replica_id)
        await self._end_streams_on(replica_id, {})

    def _forget_replica(self, replica_id: str) -> None:
        """The router lists the replica dead: what this gateway knows of it goes."""
        self.background.spawn(self.replica_lost(replica_id, "the router lists it dead"))

    def _forget_calls(self, replica_id: str) -> None:
        self.routes.drop_replica(replica_id)
        self.calls.forget(replica_id)

    async def _end_streams_on(self, replica_id: str, restored: dict[str, int]) -> None:
        """End the calls streaming sessions of ``replica_id``, which ended: a turn in flight
        there will never end. Each session goes on where the router has it now, at its
        committed tokens (``restored`` from its checkpoint, session id -> committed tokens, or
        moved off before, read from its new replica), or its state is gone."""
        for inbox in self.delivery.streaming_on(replica_id):
            committed = restored.get(inbox.session_id)
            if committed is None:
                committed = await self._committed_elsewhere(inbox.session_id, replica_id)
            inbox.put(ReplicaLost(replica_id, committed))

    async def _committed_elsewhere(self, session_id: str, replica_id: str) -> int | None:
        """The committed tokens of a session the router has on another replica than
        ``replica_id``; None when it has none (the session is gone)."""
        where = await self.router.route(session_id=session_id, tenant=None)
        if not isinstance(where, Route) or where.replica_id == replica_id:
            return None
        try:
            info = await where.replica.get_session(session_id=session_id)
        except Exception as exc:  # noqa: BLE001 - that replica is going too: the state is gone
            log.info("session %s on %s: %s", session_id, where.replica_id, exc)
            return None
        return None if isinstance(info, ActorError) else info.committed_tokens
