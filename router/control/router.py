"""``SessionRouter``: the one named actor that pins every session to the replica holding it.

It owns the session table (session_id -> replica, tenant, last_active) and the replica registry
(``router.control.registry``: handle, latest ``PoolSnapshot``, health), and builds the parts that
do its work, each given what it uses; every remote method is one method here (Ray needs it on the
class), handed to the part whose work it is. It places new sessions by free room
(``router.control.placement``), waits up to ``open_timeout_s`` (or the caller's deadline) for
it, and leaves no session behind for a caller that has gone (``router.control.opens``). It
detects dead replicas (failed calls, a replica's report that its engine died, stale snapshots and
failed pings: ``router.control.health``). A session's state lives only on its replica: the
router routes a session elsewhere only when its state moves too (``router.control.migration``:
drain with migration, MigrateSession); a route asked for while its session moves waits for the
move. A session whose replica died is answered ABORTED. After its own restart the router
rebuilds its table from the replicas, which re-register with their sessions when their next
snapshot report is not recognised. Each incarnation of the router has its own id, which every
report's reply and every move it sends carry: a replica refuses a move of a router it no longer
reports to (``replica.actor.moves``).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from replica.api import ActorError, PoolSnapshot, ReplicaDescription, ReportReply
from router.config import RouterConfig
from router.control.api import Drained, FailoverOutcome, ReplicaView, Route
from router.control.cluster_calls import ClusterCalls
from router.control.drain import Drainer
from router.control.failover import Failover
from router.control.forks import Forks
from router.control.health import HealthWatch
from router.control.lost_replicas import LostReplicas
from router.control.migration import Migrator
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.routing import Routing
from router.control.table import SessionTable

log = logging.getLogger(__name__)


class SessionRouter:
    def __init__(self, config: RouterConfig | None = None) -> None:
        config = config or RouterConfig()
        self.incarnation = secrets.token_hex(6)  # this instance's: Ray's restart makes another
        self.replicas = ReplicaRegistry()
        self.sessions = SessionTable()
        self.routing = Routing(self.replicas, self.sessions)
        self.opener = Opener(
            self.replicas, self.sessions, self._view, self._declare_dead, config.open_timeout_s
        )
        self.cluster = ClusterCalls(self.replicas, self.sessions, self.opener)
        self.health = HealthWatch(
            self.replicas,
            self._declare_dead,
            config.stale_after_s,
            config.health_interval_s,
            config.dead_replica_retention_s,
        )
        self.migrator = Migrator(
            self.replicas, self.sessions, self._view, self._declare_dead, self.incarnation
        )
        self.failover = Failover(
            self.replicas,
            self.sessions,
            self.migrator,
            self.opener,
            self._declare_dead,
            config.failover_wait_s,
            config.checkpoint_dir,
        )
        self.drainer = Drainer(
            self.replicas,
            self.migrator,
            self._view,
            self.opener.wait_for_room,
            config.drain_timeout_s,
        )
        self.lost = LostReplicas(self.replicas, self.sessions, self._declare_dead)
        self.forks = Forks(
            self.replicas, self.sessions, self.routing.route, self.opener, config.open_timeout_s
        )
        self._health_task: asyncio.Task | None = None

    def _start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self.health.run())

    def _view(self, replica_id: str) -> ReplicaView:
        pinned = self.sessions.pinned_to(replica_id)
        moving = self.migrator.claims.moving[replica_id]
        return self.replicas[replica_id].view(replica_id, pinned, moving)

    async def _declare_dead(self, replica_id: str, why: str) -> None:
        await self.replica_failed(replica_id, why, wait=False)

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
        moving: list[str] | None = None,
    ) -> None:
        """``ClusterCalls.register_replica``."""
        self._start()
        await self.cluster.register_replica(
            replica_id,
            handle,
            desc,
            dict(tenants or {}),
            snapshot,
            checkpoints,
            blank or {},
            list(moving or ()),
        )

    async def report(self, snapshot: PoolSnapshot, released: list[str]) -> ReportReply:
        """``ClusterCalls.report`` (``known`` False: the replica must register again), with this
        router's incarnation."""
        self._start()
        return ReportReply(await self.cluster.report(snapshot, released), self.incarnation)

    async def replica_failed(self, replica_id: str, why: str, wait: bool = True) -> FailoverOutcome:
        """Mark a replica dead (once) and restore its sessions elsewhere from their checkpoints
        (``router.control.failover``); with ``wait``, answers what became of them."""
        if replica_id not in self.replicas:
            return FailoverOutcome()
        if self.replicas.mark_dead(replica_id):
            log.error("replica %s is dead (%s)", replica_id, why)
            self.failover.start(replica_id)
        return await self.failover.outcome(replica_id) if wait else FailoverOutcome()

    async def recover_replica(
        self, replica_id: str, desc: ReplicaDescription, checkpoints: Any, why: str
    ) -> int:
        """``LostReplicas.recover``: a replica that died unknown to this router."""
        return await self.lost.recover(replica_id, desc, checkpoints, why)

    async def replicas_accounted(self) -> None:
        """The controller's word that every replica it knows has registered here or been handed
        over (``recover_replica``): routes of unknown sessions stop waiting (``Routing``)."""
        self.routing.accounted()
        await self.cluster.replicas_accounted()

    async def views(self) -> list[ReplicaView]:
        return [self._view(rid) for rid in sorted(self.replicas)]

    async def replica_handles(self) -> dict[str, Any]:
        """The actor handle of every live replica, by id (gateways open sessions on them)."""
        return self.replicas.live_handles()

    async def checkpoint_stores(self) -> dict[str, Any]:
        """Every live replica's current checkpoint store, by replica id (a serve taking over the
        deployment supervises them; a replacement's name is not the first store's)."""
        return self.replicas.live_stores()

    async def replace_checkpoint_store(self, replica_id: str, store: Any) -> bool:
        """``ClusterCalls.replace_checkpoint_store``."""
        return self.cluster.replace_checkpoint_store(replica_id, store)

    async def retire_replica(self, replica_id: str) -> bool | ActorError:
        """``ClusterCalls.retire_replica``."""
        return self.cluster.retire_replica(replica_id)

    async def drain(
        self, replica_id: str, migrate: bool = False, timeout_s: float | None = None
    ) -> Drained | ActorError:
        """Drain a replica: it takes no new session; with ``migrate`` its sessions move to
        the other replicas, and the answer comes when it holds none (``sessions_left`` 0: it
        can be stopped) or ``timeout_s`` (default ``drain_timeout_s``) has passed, with how many
        are left; the replica stays DRAINING until ``resume`` (``router.control.drain``)."""
        return await self.drainer.drain(replica_id, migrate, timeout_s)

    async def resume(self, replica_id: str) -> ReplicaView | ActorError:
        """Undo a drain: the replica takes new sessions again."""
        return await self.drainer.resume(replica_id)

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
            return await self.routing.route_with_info(session_id, tenant)
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
            return await self.routing.route_with_info(child_id, tenant)
        return await self.forks.fork(parent_id, child_id, tenant, gateway_id, wait_s)

    async def abandon_open(self, session_id: str) -> None:
        """The caller of the open of ``session_id`` has gone (cancelled, deadline passed): the
        open must leave no session behind, whether it waits, runs or has already landed."""
        await self.opener.abandon(session_id)

    async def route(self, session_id: str, tenant: str | None = "") -> Route | ActorError:
        """Where the session lives (waiting while it moves), for ``tenant`` (None: an admin,
        who may route any tenant's session): ``Routing.route``."""
        return await self.routing.route(session_id, tenant)

    async def migrate_session(
        self, session_id: str, target_replica_id: str = "", wait_s: float | None = None
    ) -> Route | ActorError:
        """Move one session to ``target_replica_id`` (empty: placement chooses); a running
        turn ends first (waiting at most ``wait_s``, default ``drain_timeout_s``). Answers the
        session's new route, with its facts."""
        return await self.drainer.migrate_session(
            session_id,
            target_replica_id or None,
            wait_s,
            self.routing.route,
            self.routing.with_info,
        )

    async def update_sessions(
        self,
        pins: list[tuple[str, str, str, float | None]],
        forgets: list[tuple[str, str]],
        snapshots: list[PoolSnapshot],
    ) -> list[bool]:
        """``ClusterCalls.update_sessions``: per pin, whether it was pinned."""
        return await self.cluster.update_sessions(pins, forgets, snapshots)

    async def forget(
        self,
        session_ids: list[str],
        snapshot: PoolSnapshot | None = None,
        replica_id: str | None = None,
    ) -> None:
        """``ClusterCalls.forget``: sessions a gateway released on their replica itself."""
        await self.cluster.forget(session_ids, snapshot, replica_id)

    async def session_count(self) -> int:
        return len(self.sessions)

    async def pinned_sessions(self, replica_id: str) -> list[str]:
        """The sessions the table pins to ``replica_id`` (an operator's view; sorted)."""
        return self.sessions.sessions_of(replica_id)
