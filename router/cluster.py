"""The gateway's view of the cluster: router calls, a route cache and one output pump per replica.

A turn costs no router call: routes are cached when a session is opened (or looked up once).
Token delivery costs no Ray round trip per token: for each replica the gateway keeps one
long-lived ``stream_outputs`` call whose items carry everything an engine step produced for this
gateway's sessions; the pump hands each event to the inbox (an ``asyncio.Queue``) of its session.
When a replica's stream breaks, the replica is reported dead and every waiting session gets an
ABORTED event, so no client hangs on a turn that will never end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError

from replica.outputs import ActorError, TurnEvent
from router.table import Route
from router.views import ReplicaHealth, ReplicaView

log = logging.getLogger(__name__)

ROUTE_CACHE_SIZE = 100_000
ROUTER_RETRY_S = 15.0  # how long idempotent router calls wait out a router restart


async def _logged(awaitable) -> None:
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001 - cleanup of a replica that may be gone
        log.warning("background cleanup failed: %s", exc)


class RouteCache(OrderedDict):
    """Routes of recently used sessions, least recently used first. Bounded: sessions released
    behind the gateway's back (idle timeouts) fall out; a miss costs one router call."""

    def __getitem__(self, session_id: str) -> Route:
        self.move_to_end(session_id)
        return super().__getitem__(session_id)

    def get(self, session_id: str, default=None):
        return self[session_id] if session_id in self else default

    def __setitem__(self, session_id: str, route: Route) -> None:
        super().__setitem__(session_id, route)
        self.move_to_end(session_id)
        while len(self) > ROUTE_CACHE_SIZE:
            self.popitem(last=False)


async def next_turn_event(inbox: asyncio.Queue, turn_id: int) -> TurnEvent:
    """The next event of turn ``turn_id`` (or of the replica's loss), merged with the events of
    that turn already queued behind it: a client that falls behind gets fewer, larger chunks."""
    event: TurnEvent | None = None
    while event is None or (not event.finished and not inbox.empty()):
        item = await inbox.get()  # does not wait once ``event`` is set: the queue is not empty
        if item.turn_id not in (turn_id, -1):
            continue  # a stale event of an earlier turn
        if event is None or item.error_code is not None:
            event = item
        else:
            event = dataclasses.replace(
                item, token_ids=event.token_ids + item.token_ids, text=event.text + item.text
            )
    return event


class Cluster:
    def __init__(self, router: Any, views_interval_s: float = 1.0) -> None:
        self.router = router
        self.gateway_id = f"gw-{uuid.uuid4().hex[:12]}"
        self.routes: RouteCache = RouteCache()
        self.inboxes: dict[str, asyncio.Queue] = {}
        self._pumps: dict[str, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self.cached_views: list[ReplicaView] = []
        self._dead: set[str] = set()  # replicas the router has declared dead
        self._views_interval_s = views_interval_s
        self._views_task: asyncio.Task | None = None

    async def ask_router(self, method: str, *args: Any, retry: bool = True) -> Any:
        """Call the router; while it restarts (Ray brings it back), retry idempotent calls, and
        answer UNAVAILABLE when it stays away or the call must not be repeated."""
        deadline = time.monotonic() + (ROUTER_RETRY_S if retry else 0.0)
        while True:
            try:
                return await getattr(self.router, method).remote(*args)
            except (ActorUnavailableError, RayActorError) as exc:
                if time.monotonic() >= deadline:
                    return ActorError(
                        "UNAVAILABLE",
                        "the session router is restarting or down "
                        f"({type(exc).__name__}); retry shortly",
                    )
                await asyncio.sleep(0.2)

    def start(self) -> None:
        self._views_task = asyncio.get_running_loop().create_task(self._poll_views())

    async def _poll_views(self) -> None:
        """Cache the router's views so a metrics scrape never calls an actor."""
        while True:
            try:
                views = await self.ask_router("views", retry=False)
                if not isinstance(views, ActorError):
                    self.cached_views = views
                    dead = {v.replica_id for v in views if v.health == ReplicaHealth.DEAD}
                    for replica_id in dead - self._dead:  # the router's verdict is final here
                        self._abort_sessions_of(replica_id)
                    self._dead = dead
            except Exception as exc:  # noqa: BLE001 - the router may be restarting
                log.warning("could not read replica views from the router: %s", exc)
            await asyncio.sleep(self._views_interval_s)

    def background(self, awaitable) -> None:
        """Run a cleanup (a coroutine or an actor call) that must finish even if the caller is
        cancelled; failures are logged."""
        task = asyncio.get_running_loop().create_task(_logged(awaitable))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- routes -------------------------------------------------------------------------

    async def open(self, idle_timeout_s: float, tenant: str) -> Route | ActorError:
        # the session id is chosen here so that a retried open is idempotent at the router
        route = await self.ask_router(
            "open_session", idle_timeout_s, tenant, self.gateway_id, secrets.token_hex(16)
        )
        if isinstance(route, Route):
            self.routes[route.session_id] = route
            self._ensure_pump(route)
        return route

    async def route(self, session_id: str, tenant: str) -> Route | ActorError:
        route = self.routes.get(session_id)
        if route is None or route.tenant != tenant:  # another tenant: the router decides
            route = await self.ask_router("route", session_id, tenant)
            if isinstance(route, Route):
                self.routes[session_id] = route
                self._ensure_pump(route)
        return route

    async def close(
        self, session_id: str, tenant: str, reason: str = "closed"
    ) -> bool | ActorError:
        """Close on the session's replica directly (one hop), then tell the router. The route
        lookup checks the tenant; an unknown or lost session was not open."""
        route = await self.route(session_id, tenant)
        if isinstance(route, ActorError):
            return False if route.code in ("NOT_FOUND", "ABORTED") else route
        return await self.release(route, reason)

    async def release(self, route: Route, reason: str) -> bool:
        """Release a session on its replica straight away, then tell the router; returns whether
        it was open."""
        self.routes.pop(route.session_id, None)
        try:
            (was_open,) = await route.handle.close_sessions.remote([route.session_id], reason)
        except Exception as exc:  # noqa: BLE001 - the replica is gone; so is the session
            log.warning("release of %s failed: %s", route.session_id, exc)
            was_open = False
        self.background(self.ask_router("forget", [route.session_id]))  # off the reply's path
        return was_open

    # ----- output pumps ---------------------------------------------------------------------

    def claim_inbox(self, session_id: str) -> asyncio.Queue | None:
        """The queue a session's events go to while one RPC streams them; None when another
        RPC of this gateway already streams that session (a turn is in flight)."""
        if session_id in self.inboxes:
            return None
        queue = self.inboxes[session_id] = asyncio.Queue()
        return queue

    def drop_inbox(self, session_id: str, queue: asyncio.Queue) -> None:
        if self.inboxes.get(session_id) is queue:
            del self.inboxes[session_id]

    def _ensure_pump(self, route: Route) -> None:
        pump = self._pumps.get(route.replica_id)
        if pump is None or pump.done():
            loop = asyncio.get_running_loop()
            self._pumps[route.replica_id] = loop.create_task(self._pump(route))

    async def _pump(self, route: Route) -> None:
        replica_id = route.replica_id
        try:
            async for ref in route.handle.stream_outputs.remote(self.gateway_id):
                for event in await ref:
                    queue = self.inboxes.get(event.session_id)
                    if queue is not None:
                        queue.put_nowait(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica died
            log.error("output stream of replica %s broke: %s", replica_id, exc)
            await self._replica_lost(replica_id, f"output stream broke: {type(exc).__name__}")

    async def _replica_lost(self, replica_id: str, why: str) -> None:
        """This gateway saw a replica fail: abort its sessions here and tell the router."""
        self._abort_sessions_of(replica_id)
        await self.ask_router("replica_failed", replica_id, why)

    def _abort_sessions_of(self, replica_id: str) -> None:
        """Drop the routes to a dead replica; streaming calls on its sessions end ABORTED."""
        lost = [sid for sid, r in self.routes.items() if r.replica_id == replica_id]
        for sid in lost:
            self.routes.pop(sid, None)
            queue = self.inboxes.get(sid)
            if queue is not None:
                queue.put_nowait(
                    TurnEvent(
                        sid,
                        -1,
                        error_code="ABORTED",
                        error=(
                            f"the replica of session {sid} died and its state is gone; open a new "
                            "session"
                        ),
                    )
                )

    async def stop(self) -> None:
        for task in [*self._pumps.values(), self._views_task]:
            if task is not None:
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
