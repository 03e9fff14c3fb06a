"""``Gateway``: what every RPC of one gateway process shares, and the steps they are made of.

It builds what it owns: the router client, the route cache, token delivery, the cached view of
the cluster, the batched calls to the replicas and the router, the opens in one hop and the
background cleanups. A turn costs one actor call to submit (the route is cached); its events come
back through ``Delivery``, and every call streams turns through ``TurnStreams``. Calls about a
session follow it when it has moved (``Follower``), and the calls streaming it when its replica
ends (``Delivery``). Refusals are raised as ``Refused`` with the status code and a message that
says what to do.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from protos import session_router_pb2 as pb
from replica.api import ActorError, ReleaseReason, SessionInfo, StatusCode
from router.control.api import Route
from router.control.client import RouterClient
from router.gateway.auth import ApiKeys, Caller, Unauthenticated
from router.gateway.background import Background
from router.gateway.cluster_view import ClusterView
from router.gateway.convert import MAX_TEXT_BYTES, Refused, check, open_prefix
from router.gateway.delivery import Delivery
from router.gateway.direct_opens import DirectOpener
from router.gateway.follow import Follower
from router.gateway.gateway_metrics import GatewayMetrics
from router.gateway.replica_calls import ReplicaCallsByReplica
from router.gateway.route_cache import RouteCache
from router.gateway.router_updates import RouterUpdates
from router.gateway.stream_leases import LeaseRenewer
from router.gateway.turn_streams import TurnStreams

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, router: Any, keys: ApiKeys, metrics: GatewayMetrics) -> None:
        self.gateway_id = f"gw-{uuid.uuid4().hex[:12]}"
        self.keys = keys
        self.metrics = metrics
        self.background = Background()
        self.router = RouterClient(router)
        self.routes = RouteCache(self.router)
        self.calls = ReplicaCallsByReplica(self.gateway_id)
        self.delivery = Delivery(self.gateway_id, self.router, self.routes, self.calls)
        self.cluster = ClusterView(self.router, on_dead=self._listed_dead)
        self.updates = RouterUpdates(self.router)
        self.follower = Follower(
            self.routes,
            self.calls,
            self.cluster,
            self.updates,
            self.delivery,
            self.background,
            self.metrics,
        )
        self.turns = TurnStreams(
            self.delivery, self.follower, self.calls, self.background, self.metrics
        )
        self.leases = LeaseRenewer(self.follower.relocate)
        self.direct = DirectOpener(
            self.gateway_id,
            self.cluster,
            self.calls,
            self.updates,
            self.background,
            self.delivery.replica_lost,
            self.follower.call_failed,
        )

    async def start(self) -> None:
        """Start the background work, with a first view of the cluster (placement needs it)."""
        try:
            await self.cluster.refresh()
        except Exception as exc:  # noqa: BLE001 - the router may be restarting: polls retry
            log.warning("no view of the cluster yet: %s", exc)
        self.cluster.start()
        self.leases.start()

    async def stop(self) -> None:
        self.leases.stop()
        self.cluster.stop()
        self.delivery.stop()
        await self.background.drain(timeout=5)

    # ----- steps of the RPCs ----------------------------------------------------------------

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        try:
            return self.keys.caller_of(context.invocation_metadata())
        except Unauthenticated as exc:
            raise Refused(StatusCode.UNAUTHENTICATED, str(exc)) from None

    def tenant(self, context: grpc.aio.ServicerContext) -> str:
        return self.caller(context).tenant

    def admin(self, context: grpc.aio.ServicerContext) -> None:
        """Refuses a caller whose key is not an admin key (PERMISSION_DENIED)."""
        if not self.caller(context).admin:
            raise Refused(
                StatusCode.PERMISSION_DENIED,
                "AdminService needs an admin API key (a line 'KEY TENANT admin' in --api-keys)",
            )

    async def route(self, session_id: str, tenant: str) -> Route:
        if not session_id:
            raise Refused(
                StatusCode.INVALID_ARGUMENT, "session_id is required; get one from OpenSession"
            )
        return check(await self.routes.lookup(session_id, tenant))

    async def open(
        self,
        request: pb.OpenSessionRequest,
        tenant: str,
        wait_s: float | None = None,
        lease_s: float = 0.0,
    ) -> Route:
        """Open a session: in one hop where possible (``router.gateway.direct_opens``), else
        through the router, waiting for room at most ``wait_s`` (what is left of the caller's
        deadline). If the call is cancelled meanwhile (the client cancelled, its deadline
        passed), no session is kept for it. ``lease_s`` > 0: a stream holds the session open
        (``replica.sessions.stream_leases``). The request's prefix (text or token ids) is what
        the session starts holding; ``route.info.cached_tokens`` of it came from a state the
        replica had cached (placement prefers the replica holding the longest such prefix)."""
        timeout = request.idle_timeout_s
        if timeout < 0 or timeout != timeout:
            raise Refused(
                StatusCode.INVALID_ARGUMENT, "idle_timeout_s must be >= 0 (0: server default)"
            )
        prefix = open_prefix(request)
        text_bytes = len(prefix.encode("utf-8", "surrogatepass")) if type(prefix) is str else 0
        if text_bytes > MAX_TEXT_BYTES:
            raise Refused(
                StatusCode.INVALID_ARGUMENT, f"prefix_text longer than {MAX_TEXT_BYTES} bytes"
            )
        route = await self.direct.open(secrets.token_hex(16), timeout, tenant, lease_s, prefix)
        if route is None:  # a fresh id: the router may not have forgotten the first one yet
            # the session id is chosen here so that a retried open is idempotent at the router
            session_id = secrets.token_hex(16)
            route = await self._open_through_router(
                session_id, timeout, tenant, wait_s, lease_s, prefix
            )
        self.routes.put(route)
        self.delivery.watch(route)
        return route

    async def _open_through_router(
        self,
        session_id: str,
        timeout: float,
        tenant: str,
        wait_s: float | None,
        lease_s: float,
        prefix: str | list[int] | None = None,
    ) -> Route:
        try:
            route = await self.router.open_session(
                idle_timeout_s=timeout,
                tenant=tenant,
                gateway_id=self.gateway_id,
                session_id=session_id,
                wait_s=wait_s,
                lease_s=lease_s,
                prefix=prefix,
            )
        except asyncio.CancelledError:
            self.background.spawn(self.router.abandon_open(session_id=session_id))
            raise
        if isinstance(route, ActorError):
            self.metrics.open_rejected_for(
                "no_room" if route.code == StatusCode.RESOURCE_EXHAUSTED else route.code.lower()
            )
        return check(route)

    async def fork(self, parent_id: str, tenant: str, wait_s: float | None = None) -> Route:
        """Fork ``parent_id`` (``tenant``'s own) into a new session on the parent's replica,
        through the router (which pins it there), waiting for room at most ``wait_s``. If the
        call is cancelled meanwhile, no fork is kept for it."""
        if not parent_id:
            raise Refused(
                StatusCode.INVALID_ARGUMENT, "session_id of the session to fork is required"
            )
        child_id = secrets.token_hex(16)
        try:
            forked = await self.router.fork_session(
                parent_id=parent_id,
                child_id=child_id,
                tenant=tenant,
                gateway_id=self.gateway_id,
                wait_s=wait_s,
            )
        except asyncio.CancelledError:
            self.background.spawn(self.router.abandon_open(session_id=child_id))
            raise
        route = check(forked)
        self.routes.put(route)
        self.delivery.watch(route)
        return route

    def adopt_fork(self, parent: Route, info: SessionInfo) -> Route:
        """The route of a fork that ``parent``'s replica made beside a turn (``TurnStreams.start``
        with a fork): usable here at once; the router learns of it off the turn's path (a pin,
        batched with this gateway's others, queued before any release of it), and when it
        refuses the pin (it knows that replica dead) the fork is released."""
        route = Route(info.session_id, parent.replica_id, parent.handle, info, parent.tenant)
        self.routes.put(route)
        self.delivery.watch(route)
        pinned = self.updates.pin(route.session_id, route.replica_id, route.tenant)
        self.background.spawn(self._keep_pinned(route, pinned))
        return route

    def released_there(self, route: Route) -> None:
        """``route``'s session was released on its replica by a command of this gateway (a
        fork's submit released the rollback point it replaces): forgotten here, and at the
        router (batched, off the reply's path)."""
        self.routes.drop(route.session_id)
        self.updates.forget(route.session_id, route.replica_id)

    async def _keep_pinned(self, route: Route, pinned: asyncio.Future) -> None:
        try:
            ok = await pinned
        except Exception as exc:  # noqa: BLE001 - the router is away: its rebuild finds the fork
            log.info("pin of fork %s failed: %s", route.session_id, exc)
            return
        if ok is False:
            await self.release(route, ReleaseReason.ABORTED)

    async def on_session(
        self, route: Route, what: str, make: Callable[[Route], Awaitable[Any]]
    ) -> tuple[Route, Any]:
        """``Follower.on_session``: an actor call about a session, made where the session is."""
        return await self.follower.on_session(route, what, make)

    async def relocate(self, route: Route) -> Route | ActorError:
        """``Follower.relocate``: where ``route``'s session is now, asked of the router."""
        return await self.follower.relocate(route)

    async def release(self, route: Route, reason: ReleaseReason) -> bool:
        """``Follower.release``: release a session where it is; whether it was open."""
        return await self.follower.release(route, reason)

    async def close(self, session_id: str, tenant: str) -> bool:
        """Close on the session's replica directly (one hop), then tell the router. The route
        lookup checks the tenant; an unknown or lost session was not open."""
        route = await self.routes.lookup(session_id, tenant)
        if isinstance(route, ActorError):
            if route.code in (StatusCode.NOT_FOUND, StatusCode.ABORTED):
                return False
            check(route)
        return await self.release(route, ReleaseReason.CLOSED)

    def _listed_dead(self, replica_id: str) -> None:
        """The router lists the replica dead: what this gateway knows of it goes."""
        self.background.spawn(self.delivery.replica_lost(replica_id, "the router lists it dead"))
