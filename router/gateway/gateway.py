"""``Gateway``: what every RPC of one gateway process shares, and the steps they are made of.

It builds what it owns: the router client, the route cache, token delivery, the cached view of
the cluster and the background cleanups. A turn costs one actor call to submit (the route is
cached); its events come back through ``Delivery``. Calls about a session follow it when it has
moved (``router.gateway.follow``). Refusals are raised as ``Refused`` with the status code and a
message that says what to do.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from typing import Any

import grpc

from protos import session_router_pb2 as pb
from replica.api import (
    ActorError,
    InvalidRequestError,
    ReleaseReason,
    StatusCode,
    TurnEvent,
)
from router.control.table import Route
from router.gateway.auth import ApiKeys, Caller, Unauthenticated
from router.gateway.background import Background
from router.gateway.cluster_view import ClusterView
from router.gateway.convert import Refused, check, chunk_from_event, sampling_from_proto, turn_input
from router.gateway.delivery import Delivery
from router.gateway.follow import Following
from router.gateway.metrics import GatewayMetrics
from router.gateway.route_cache import RouteCache
from router.gateway.router_client import RouterClient
from router.gateway.stream_leases import LeaseRenewer

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 1 << 20


class Gateway(Following):
    def __init__(self, router: Any, keys: ApiKeys, metrics: GatewayMetrics) -> None:
        self.gateway_id = f"gw-{uuid.uuid4().hex[:12]}"
        self.keys = keys
        self.metrics = metrics
        self.background = Background()
        self.router = RouterClient(router)
        self.routes = RouteCache(self.router)
        self.delivery = Delivery(self.gateway_id, on_lost=self.replica_lost)
        self.cluster = ClusterView(self.router, on_dead=self._forget_replica)
        self.leases = LeaseRenewer(self.relocate)

    def start(self) -> None:
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
        """Open a session; waits for room at most ``wait_s`` (what is left of the caller's
        deadline). If the call is cancelled meanwhile (the client cancelled, its deadline
        passed), the open is abandoned at the router, which keeps no session for it.
        ``lease_s`` > 0: a stream holds the session open (``replica.sessions.stream_leases``)."""
        timeout = request.idle_timeout_s
        if timeout < 0 or timeout != timeout:
            raise Refused(
                StatusCode.INVALID_ARGUMENT, "idle_timeout_s must be >= 0 (0: server default)"
            )
        # the session id is chosen here so that a retried open is idempotent at the router
        session_id = secrets.token_hex(16)
        try:
            route = await self.router.call(
                "open_session", timeout, tenant, self.gateway_id, session_id, wait_s, lease_s
            )
        except asyncio.CancelledError:
            self.background.spawn(self.router.call("abandon_open", session_id))
            raise
        if isinstance(route, ActorError):
            self.metrics.open_rejected_for(
                "no_room" if route.code == StatusCode.RESOURCE_EXHAUSTED else route.code.lower()
            )
        route = check(route)
        self.routes.put(route)
        self.delivery.watch(route)
        return route

    async def submit(self, route: Route, request: pb.GenerateRequest) -> tuple[Route, int]:
        """Queue a turn where the session is; returns the route it went to and its turn id."""
        text, ids = turn_input(request)
        if text is not None and len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise Refused(StatusCode.INVALID_ARGUMENT, f"text longer than {MAX_TEXT_BYTES} bytes")
        try:
            sampling = sampling_from_proto(request.sampling)
        except InvalidRequestError as exc:
            raise Refused(StatusCode.INVALID_ARGUMENT, str(exc)) from None
        return await self.on_session(
            route,
            "submit_turn",
            lambda r: r.handle.submit_turn.remote(
                self.gateway_id, r.session_id, text, ids, sampling
            ),
        )

    def chunk(self, event: TurnEvent, started: float, first: bool) -> pb.GenerateChunk:
        if event.error_code is not None:
            raise Refused(event.error_code, event.error or "turn failed")
        if first and event.token_ids:
            self.metrics.observe_first_token(time.perf_counter() - started)
        self.metrics.add_generated_tokens(len(event.token_ids))
        return chunk_from_event(event)

    async def close(self, session_id: str, tenant: str) -> bool:
        """Close on the session's replica directly (one hop), then tell the router. The route
        lookup checks the tenant; an unknown or lost session was not open."""
        route = await self.routes.lookup(session_id, tenant)
        if isinstance(route, ActorError):
            if route.code in (StatusCode.NOT_FOUND, StatusCode.ABORTED):
                return False
            check(route)
        return await self.release(route, ReleaseReason.CLOSED)

    # ----- replicas that die ------------------------------------------------------------------

    async def replica_lost(self, replica_id: str, why: str) -> None:
        """This gateway saw a replica fail: tell the router, then end the calls of its sessions
        here as the router's failover says (restored elsewhere, or gone)."""
        self.routes.drop_replica(replica_id)
        outcome = await self.router.call("replica_failed", replica_id, why)
        restored = {} if isinstance(outcome, ActorError) else outcome.restored
        self.delivery.end_replica(replica_id, restored)

    def _forget_replica(self, replica_id: str) -> None:
        """The router lists the replica dead: what this gateway knows of it goes."""
        self.background.spawn(self.replica_lost(replica_id, "the router lists it dead"))
