"""``SessionRouter``: the one named actor that pins every session to the replica holding it.

It owns the session table (session_id -> replica, tenant, last_active) and the replica registry
(handle, latest ``PoolSnapshot``, health). It places new sessions by real free capacity
(``router.control.placement``), waits up to ``open_timeout_s`` for room, and detects dead replicas
(failed calls, stale snapshots, failed pings). A session's state lives only on its replica: the
router never routes a session elsewhere; a session whose replica died is answered ABORTED.
After its own restart the router rebuilds its table from the replicas, which re-register with
the sessions they hold when their next snapshot report is not recognised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from typing import Any

from replica.api import (
    ActorError,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
    StatusCode,
    replica_lost_message,
)
from router.config import RouterConfig
from router.control.placement import choose_replica, room_report
from router.control.table import ReplicaEntry, Route, SessionState, SessionTable
from router.control.views import ReplicaHealth, ReplicaView

log = logging.getLogger(__name__)

ROUTER_NAME = "session-router"


class SessionRouter:
    def __init__(self, config: RouterConfig | None = None) -> None:
        config = config or RouterConfig()
        self.open_timeout_s = config.open_timeout_s
        self.stale_after_s = config.stale_after_s
        self.health_interval_s = config.health_interval_s
        self.replicas: dict[str, ReplicaEntry] = {}
        self.sessions = SessionTable()
        self._room = asyncio.Condition()
        self._opening: dict[str, asyncio.Future] = {}  # opens in flight, by session id
        self._health_task: asyncio.Task | None = None

    def _start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    # ----- replicas -----------------------------------------------------------------------

    async def register_replica(
        self,
        replica_id: str,
        handle: Any,
        desc: ReplicaDescription,
        tenants: dict[str, str] | None = None,
        snapshot: PoolSnapshot | None = None,
    ) -> None:
        """Add or refresh a replica, adopting the sessions it says it holds (id -> tenant)."""
        self._start()
        tenants = dict(tenants or {})
        entry = self.replicas.get(replica_id)
        fenced = (
            entry is not None
            and entry.health == ReplicaHealth.DEAD
            and entry.desc.incarnation == desc.incarnation
        )
        if fenced and tenants:
            # Declared dead (its clients were told ABORTED) but alive after all: its sessions
            # must not come back, so the replica releases them and rejoins empty.
            log.warning(
                "replica %s came back after it was declared dead; releasing its %d sessions",
                replica_id,
                len(tenants),
            )
            await handle.close_sessions.remote(list(tenants), ReleaseReason.REPLICA_LOST)
            tenants = {}
        if entry is None or entry.desc.incarnation != desc.incarnation:
            entry = self.replicas[replica_id] = ReplicaEntry(handle, desc)
        entry.handle, entry.health = handle, ReplicaHealth.HEALTHY
        if snapshot is not None:
            entry.take(snapshot)
        for sid, tenant in tenants.items():
            self.sessions.pin(sid, replica_id, tenant)
        log.info("replica %s registered with %d sessions", replica_id, len(tenants))
        await self._notify_room()

    async def report(self, snapshot: PoolSnapshot, released: list[str]) -> bool:
        """A replica's periodic snapshot; False when the replica must register (again)."""
        self._start()
        entry = self.replicas.get(snapshot.replica_id)
        if entry is None or entry.desc.incarnation != snapshot.incarnation:
            return False
        entry.take(snapshot)
        if entry.health == ReplicaHealth.DEAD:
            return False
        for sid in released:
            self.sessions.forget(sid)
        await self._notify_room()
        return True

    async def replica_failed(self, replica_id: str, why: str) -> None:
        """Mark a replica dead: its sessions are answered ABORTED from now on."""
        entry = self.replicas.get(replica_id)
        if entry is None or entry.health == ReplicaHealth.DEAD:
            return
        entry.health = ReplicaHealth.DEAD
        lost = self.sessions.abort_replica(replica_id)
        entry.lost += lost
        log.error("replica %s is dead (%s); %d sessions lost", replica_id, why, lost)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            now = time.monotonic()
            for replica_id, entry in list(self.replicas.items()):
                if entry.health == ReplicaHealth.DEAD:
                    continue
                if now - entry.reported_at > self.stale_after_s:
                    await self._probe(replica_id, entry, "snapshot stale")

    async def _probe(self, replica_id: str, entry: ReplicaEntry, why: str) -> None:
        try:
            ok = await asyncio.wait_for(entry.handle.ping.remote(), timeout=self.stale_after_s)
        except Exception as exc:  # noqa: BLE001 - any failure to answer is death
            ok, why = False, f"{why}; ping failed: {type(exc).__name__}"
        if not ok:
            await self.replica_failed(replica_id, why)

    async def drain(self, replica_id: str, draining: bool = True) -> ReplicaView | ActorError:
        entry = self.replicas.get(replica_id)
        if entry is None:
            return ActorError(StatusCode.NOT_FOUND, f"no replica {replica_id!r}; see ListReplicas")
        if entry.health != ReplicaHealth.DEAD:
            await entry.handle.drain.remote(draining)
            entry.health = ReplicaHealth.DRAINING if draining else ReplicaHealth.HEALTHY
        return self._view(replica_id)

    def _view(self, replica_id: str) -> ReplicaView:
        return self.replicas[replica_id].view(replica_id, self.sessions.pinned_to(replica_id))

    async def views(self) -> list[ReplicaView]:
        return [self._view(rid) for rid in sorted(self.replicas)]

    # ----- sessions -----------------------------------------------------------------------

    async def open_session(
        self,
        idle_timeout_s: float = 0.0,
        tenant: str = "",
        gateway_id: str = "",
        session_id: str = "",
    ) -> Route | ActorError:
        """Place a new session; waits up to ``open_timeout_s`` for room.

        Idempotent per ``session_id`` (the caller may choose it, 128-bit random): a retry of an
        open that already ran, or is running, returns the same session instead of a second one.
        """
        self._start()
        session_id = session_id or secrets.token_hex(16)
        if session_id in self._opening:
            return await asyncio.shield(self._opening[session_id])
        if session_id in self.sessions:
            route = await self.route(session_id, tenant)
            if isinstance(route, ActorError):
                return route
            info = await route.handle.get_session.remote(session_id)
            return info if isinstance(info, ActorError) else dataclasses.replace(route, info=info)
        opening = self._opening[session_id] = asyncio.get_running_loop().create_future()
        try:
            result = await self._place(session_id, idle_timeout_s, tenant, gateway_id)
            opening.set_result(result)
            return result
        finally:
            del self._opening[session_id]
            if not opening.done():
                opening.cancel()

    async def _place(
        self, session_id: str, idle_timeout_s: float, tenant: str, gateway_id: str
    ) -> Route | ActorError:
        deadline = time.monotonic() + self.open_timeout_s
        refused: dict[str, int] = {}
        while True:
            views = [self._view(rid) for rid in self.replicas]
            reserved = {rid: e.reserved + refused.get(rid, 0) for rid, e in self.replicas.items()}
            replica_id = choose_replica(views, reserved)
            if replica_id is not None:
                route = await self._open_on(
                    replica_id, session_id, idle_timeout_s, tenant, gateway_id
                )
                if not isinstance(route, ActorError):
                    return route
                if route.code != StatusCode.RESOURCE_EXHAUSTED:
                    return route
                refused[replica_id] = 10**6  # full after all: skip it until its next snapshot
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return ActorError(
                    StatusCode.RESOURCE_EXHAUSTED, room_report(views, reserved).message()
                )
            try:
                async with self._room:
                    await asyncio.wait_for(self._room.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass
            refused.clear()

    async def _open_on(
        self, replica_id: str, session_id: str, idle_timeout_s: float, tenant: str, gateway_id: str
    ) -> Route | ActorError:
        entry = self.replicas[replica_id]
        entry.reserved += 1  # in flight: not in any snapshot yet
        try:
            opened = await entry.handle.open_session.remote(
                session_id, idle_timeout_s, gateway_id, tenant
            )
        except Exception as exc:  # noqa: BLE001 - the replica died under us
            await self.replica_failed(replica_id, f"open_session failed: {exc}")
            return ActorError(StatusCode.RESOURCE_EXHAUSTED, f"replica {replica_id} failed; retry")
        finally:
            entry.reserved -= 1
        if isinstance(opened, ActorError):
            return opened
        entry.take(opened.snapshot)  # counts the new session
        self.sessions.pin(session_id, replica_id, tenant)
        return Route(session_id, replica_id, entry.handle, opened.info, tenant)

    async def route(self, session_id: str, tenant: str = "") -> Route | ActorError:
        session = self.sessions.get(session_id)
        if session is None:
            return ActorError(
                StatusCode.NOT_FOUND, f"session {session_id} is not open; open a new one"
            )
        if session.state == SessionState.ABORTED:
            return ActorError(StatusCode.ABORTED, replica_lost_message(session_id))
        if session.tenant and session.tenant != tenant:
            return ActorError(
                StatusCode.PERMISSION_DENIED, f"session {session_id} belongs to another tenant"
            )
        entry = self.replicas[session.replica_id]
        return Route(session_id, session.replica_id, entry.handle, tenant=session.tenant)

    async def forget(self, session_ids: list[str], snapshot: PoolSnapshot | None = None) -> None:
        """Gateways release sessions on their replica directly (close, stream end), then report
        them here with the replica's snapshot after the release, so the table and the room for
        new sessions follow at once."""
        if snapshot is not None and snapshot.replica_id in self.replicas:
            self.replicas[snapshot.replica_id].take(snapshot)
        for sid in session_ids:
            self.sessions.forget(sid)
        await self._notify_room()

    async def session_count(self) -> int:
        return len(self.sessions)
