"""``SessionRouter``: the one named actor that pins every session to the replica holding it.

It owns the session table (session_id -> replica, tenant, last_active) and the replica registry
(``router.control.registry``: handle, latest ``PoolSnapshot``, health), which it hands to each of
its collaborators. It places new sessions by real free capacity
(``router.control.placement``), waits up to ``open_timeout_s`` (or the caller's deadline) for
room, and leaves no session behind for a caller that has gone (``router.control.opens``). It
detects dead replicas (failed calls, a replica's report that its engine died, stale snapshots and
failed pings: ``router.control.health``). A session's state lives only on its replica: the
router routes a session elsewhere only when its state moves too (``router.control.migration``:
drain with migration, MigrateSession); a route asked for while its session moves waits for the
move. A session whose replica died is answered ABORTED.
After its own restart the router rebuilds its table from the replicas, which re-register with
the sessions they hold when their next snapshot report is not recognised.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from replica.actor.client import ReplicaClient
from replica.api import (
    ActorError,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
    StatusCode,
    clip_id,
    replica_lost_message,
)
from router.config import RouterConfig
from router.control.admin_calls import AdminCalls
from router.control.api import FailoverOutcome, ReplicaHealth, ReplicaView, Route
from router.control.cluster_calls import ClusterCalls
from router.control.drain import Drainer
from router.control.failover import Failover
from router.control.forks import Forks
from router.control.health import HealthWatch
from router.control.migration import Migrator
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.table import BlankOpen, SessionState, SessionTable

log = logging.getLogger(__name__)


class SessionRouter(AdminCalls, ClusterCalls):
    def __init__(self, config: RouterConfig | None = None) -> None:
        config = config or RouterConfig()
        self.replicas = ReplicaRegistry()
        self.sessions = SessionTable()
        self.opener = Opener(
            self.replicas, self.sessions, self._view, self._declare_dead, config.open_timeout_s
        )
        self.health = HealthWatch(
            self.replicas,
            self._declare_dead,
            config.stale_after_s,
            config.health_interval_s,
            config.dead_replica_retention_s,
        )
        self.migrator = Migrator(self.replicas, self.sessions, self._view, self._declare_dead)
        self.failover = Failover(
            self.replicas,
            self.sessions,
            self.migrator,
            self.opener.wait_for_room,
            self._declare_dead,
            config.open_timeout_s,
        )
        self.drainer = Drainer(
            self.replicas,
            self.migrator,
            self._view,
            self.opener.wait_for_room,
            config.drain_timeout_s,
        )
        self.forks = Forks(
            self.replicas, self.sessions, self.route, self.opener, config.open_timeout_s
        )
        self._health_task: asyncio.Task | None = None

    def _start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self.health.run())

    # ----- replicas -----------------------------------------------------------------------

    async def register_replica(
        self,
        replica_id: str,
        handle: Any,
        desc: ReplicaDescription,
        tenants: dict[str, str] | None = None,
        snapshot: PoolSnapshot | None = None,
        checkpoints: Any = None,
        blank: dict[str, float] | None = None,
    ) -> None:
        """Add or refresh a replica, adopting the sessions it says it holds (id -> tenant);
        ``checkpoints`` is its checkpoint store, when it has one; ``blank`` those sessions that
        hold nothing yet, with their idle timeouts (a failover may open them again, empty).

        A replica declared dead stays dead (the serve process kills and replaces it): if it
        turns out to be alive, its sessions, whose clients were told ABORTED, are released."""
        self._start()
        tenants = dict(tenants or {})
        if self.replicas.is_fenced(desc.incarnation):
            if tenants:
                log.warning(
                    "replica %s came back after it was declared dead; releasing its %d sessions",
                    replica_id,
                    len(tenants),
                )
                await ReplicaClient(handle).close_sessions(
                    session_ids=list(tenants), reason=ReleaseReason.REPLICA_LOST
                )
            return
        entry = self.replicas.register(replica_id, handle, desc, checkpoints)
        if snapshot is not None:
            entry.take(snapshot)
        blank = blank or {}
        for sid, tenant in tenants.items():
            empty = BlankOpen(blank[sid], entry.store_epoch) if sid in blank else None
            self.sessions.pin(sid, replica_id, tenant, empty)
        log.info("replica %s registered with %d sessions", replica_id, len(tenants))
        await self.opener.notify_room()

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
            self.sessions.released_by(sid, snapshot.replica_id)
        await self.opener.notify_room()
        return True

    async def replica_failed(self, replica_id: str, why: str, wait: bool = True) -> FailoverOutcome:
        """Mark a replica dead (once) and restore its sessions elsewhere from their checkpoints
        (``router.control.failover``); with ``wait``, answers what became of them."""
        if replica_id not in self.replicas:
            return FailoverOutcome()
        if self.replicas.mark_dead(replica_id):
            log.error("replica %s is dead (%s)", replica_id, why)
            self.failover.start(replica_id)
        return await self.failover.outcome(replica_id) if wait else FailoverOutcome()

    async def _declare_dead(self, replica_id: str, why: str) -> None:
        await self.replica_failed(replica_id, why, wait=False)

    def _view(self, replica_id: str) -> ReplicaView:
        pinned, moving = (
            self.sessions.pinned_to(replica_id),
            self.migrator.claims.moving[replica_id],
        )
        return self.replicas[replica_id].view(replica_id, pinned, moving)

    async def views(self) -> list[ReplicaView]:
        return [self._view(rid) for rid in sorted(self.replicas)]

    # ----- sessions -----------------------------------------------------------------------

    async def open_session(
        self,
        idle_timeout_s: float = 0.0,
        tenant: str = "",
        gateway_id: str = "",
        session_id: str = "",
        wait_s: float | None = None,
        lease_s: float = 0.0,
        prefix: str | list[int] | None = None,
    ) -> Route | ActorError:
        """Place a new session (holding ``prefix``, text or token ids, from the start: see
        ``SessionOps.open_session``); waits for room up to ``open_timeout_s`` or ``wait_s`` (what
        is left of the caller's deadline), whichever is shorter. ``lease_s`` > 0: a stream
        holds the session open (``ReplicaActor.hold_sessions``).

        Idempotent per ``session_id`` (the caller may choose it, 128-bit random): a retry of an
        open that already ran, or is running, returns the same session instead of a second one.
        An open abandoned by its caller (``abandon_open``) leaves no session behind.
        """
        self._start()
        session_id = session_id or secrets.token_hex(16)
        if session_id not in self.opener.running and session_id in self.sessions:
            return await self._with_info(await self.route(session_id, tenant))
        return await self.opener.open(
            session_id, idle_timeout_s, tenant, gateway_id, wait_s, lease_s, prefix
        )

    async def fork_session(
        self,
        parent_id: str,
        child_id: str,
        tenant: str = "",
        gateway_id: str = "",
        wait_s: float | None = None,
    ) -> Route | ActorError:
        """Fork ``parent_id`` (``tenant``'s) into ``child_id`` on the replica holding it, and pin
        the child there (``router.control.forks``). Idempotent per ``child_id``; abandoned with
        ``abandon_open`` like an open."""
        self._start()
        if child_id in self.sessions:
            return await self._with_info(await self.route(child_id, tenant))
        return await self.forks.fork(parent_id, child_id, tenant, gateway_id, wait_s)

    async def abandon_open(self, session_id: str) -> None:
        """The caller of the open of ``session_id`` has gone (cancelled, deadline passed): the
        open must leave no session behind, whether it waits, runs or has already landed."""
        await self.opener.abandon(session_id)

    async def route(self, session_id: str, tenant: str | None = "") -> Route | ActorError:
        """Where the session lives (waiting while it moves), for ``tenant`` (None: an admin,
        who may route any tenant's session)."""
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

    async def forget(
        self,
        session_ids: list[str],
        snapshot: PoolSnapshot | None = None,
        replica_id: str | None = None,
    ) -> None:
        """Gateways release sessions on their replica (``replica_id``) directly (close, stream
        end), then report them here with the replica's snapshot after the release, so the table
        and the room for new sessions follow at once. A session pinned to another replica by
        now (it moved) is not forgotten."""
        if snapshot is not None and snapshot.replica_id in self.replicas:
            self.replicas[snapshot.replica_id].take(snapshot)
        for sid in session_ids:
            self.sessions.forget(sid, replica_id)
        await self.opener.notify_room()

    async def session_count(self) -> int:
        return len(self.sessions)

    async def pinned_sessions(self, replica_id: str) -> list[str]:
        """The sessions the table pins to ``replica_id`` (an operator's view; sorted)."""
        return self.sessions.sessions_of(replica_id)
