"""``ClusterCalls``: the router's calls that change its tables on news from outside: a replica's
registration and periodic snapshot, gateways' batched pins and forgets of sessions they opened or
released on a replica themselves, the retirement of a replica the serve process removes
(autoscaling), and a replica's new checkpoint store (its old one died). Every change of room it
makes wakes the opens waiting for room (``Opener.notify_room``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from replica.actor.client import ReplicaClient
from replica.api import (
    ActorError,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDescription,
    StatusCode,
    clip_id,
)
from router.control.api import ReplicaHealth
from router.control.cut_off_moves import CutOffMoves
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.table import BlankOpen, SessionTable

log = logging.getLogger(__name__)


class ClusterCalls:
    def __init__(self, replicas: ReplicaRegistry, sessions: SessionTable, opener: Opener) -> None:
        self.replicas = replicas
        self.sessions = sessions
        self.opener = opener
        self.cut_off = CutOffMoves(replicas, sessions)

    async def register_replica(
        self,
        replica_id: str,
        handle: Any,
        desc: ReplicaDescription,
        tenants: dict[str, str],
        snapshot: PoolSnapshot | None,
        checkpoints: Any,
        blank: dict[str, float],
        moving: list[str],
    ) -> None:
        """Add or refresh a replica, adopting the sessions it says it holds (id -> tenant);
        ``checkpoints`` is its checkpoint store, when it has one; ``blank`` those sessions that
        hold nothing yet, with their idle timeouts (a failover may open them again, empty);
        ``moving`` those it marks moving out (a move this router's restart cut off: one copy of
        each is kept, ``CutOffMoves``).

        A replica declared dead stays dead (the serve process kills and replaces it): if it
        turns out to be alive, its sessions, restored elsewhere or told ABORTED, are released
        once its failover has ended (the failover reads their checkpoints first)."""
        if self.replicas.is_fenced(desc.incarnation):
            await self._failover_ended(replica_id, desc.incarnation)
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
        keep, release_here, release_elsewhere = self.cut_off.sort(replica_id, tenants, set(moving))
        for sid in keep:
            empty = BlankOpen(blank[sid], entry.store_epoch) if sid in blank else None
            self.sessions.pin(sid, replica_id, tenants[sid], empty)
        log.info("replica %s registered with %d sessions", replica_id, len(keep))
        await self.cut_off.release(replica_id, release_here)
        for source, ids in release_elsewhere.items():
            await self.cut_off.release(source, ids)
        await self.opener.notify_room()

    async def replicas_accounted(self) -> None:
        """Every replica has registered: moves cut off before they landed are taken back."""
        await self.cut_off.take_back()

    async def _failover_ended(self, replica_id: str, incarnation: str) -> None:
        """Wait for the failover of the fenced ``incarnation`` of ``replica_id``, if any runs."""
        entry = self.replicas.get(replica_id)
        if entry is None or entry.desc.incarnation != incarnation or entry.failover is None:
            return
        try:
            await asyncio.shield(entry.failover)
        except Exception:  # noqa: BLE001 - its failover's own failure, logged there
            log.exception("the failover of %s failed", replica_id)

    async def report(self, snapshot: PoolSnapshot, released: list[str]) -> bool:
        """A replica's periodic snapshot, and the sessions it released on its own since (idle
        timeout); False when the replica must register (again)."""
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

    async def update_sessions(
        self,
        pins: list[tuple[str, str, str, float | None]],
        forgets: list[tuple[str, str]],
        snapshots: list[PoolSnapshot],
    ) -> list[bool]:
        """A gateway's batched news (``router.gateway.router_updates``): sessions it opened on a
        replica itself (session id, replica id, tenant, and its idle timeout when it was opened
        empty, else None: ``BlankOpen``), sessions it released on a replica (session id,
        replica id: one pinned to another replica by now, it moved, is kept), and the replicas'
        snapshots from those calls' replies. Per pin, whether it was pinned: False when the
        replica is not a live one here, or has reported the session released (the gateway then
        releases the session). A session pinned here is the router's like any other: drains
        move it, failover restores it from its checkpoints."""
        for snapshot in snapshots:
            entry = self.replicas.get(snapshot.replica_id)
            if entry is not None and entry.desc.incarnation == snapshot.incarnation:
                entry.take(snapshot)
        pinned = []
        for session_id, replica_id, tenant, blank_idle_s in pins:
            entry = self.replicas.get(replica_id)
            live = entry is not None and entry.health != ReplicaHealth.DEAD
            # a pin sent before the replica's idle release, landing after it (across a router
            # restart): the session is gone there, and the gateway must not keep it
            live = live and not self.sessions.was_released(session_id, replica_id)
            if live:
                blank = None if blank_idle_s is None else BlankOpen(blank_idle_s, entry.store_epoch)
                self.sessions.pin(session_id, replica_id, tenant, blank)
            pinned.append(live)
        for sid, replica_id in forgets:
            self.sessions.forget(sid, replica_id)
        if forgets or snapshots:
            await self.opener.notify_room()
        return pinned

    async def forget(
        self, session_ids: list[str], snapshot: PoolSnapshot | None, replica_id: str | None
    ) -> None:
        """Sessions a gateway released on their replica (``replica_id``) itself (close, stream
        end), with the replica's snapshot after the release, so the table and the room for new
        sessions follow at once. A session pinned to another replica by now (it moved) is kept."""
        if snapshot is not None and snapshot.replica_id in self.replicas:
            self.replicas[snapshot.replica_id].take(snapshot)
        for sid in session_ids:
            self.sessions.forget(sid, replica_id)
        await self.opener.notify_room()

    def replace_checkpoint_store(self, replica_id: str, store: Any) -> bool:
        """``store`` now keeps ``replica_id``'s checkpoints (its failover reads them there); False
        when the replica is not a live one here (the caller ends ``store``)."""
        return self.replicas.replace_store(replica_id, store)

    def retire_replica(self, replica_id: str) -> bool | ActorError:
        """Forget a draining replica that holds no session, before the serve process stops it:
        it leaves ListReplicas and /metrics at once, never counted as dead, and may not register
        again. Refused (FAILED_PRECONDITION) while it is not draining or sessions are pinned to
        it; False when it is not known."""
        entry = self.replicas.get(replica_id)
        if entry is None:
            return False
        pinned = self.sessions.pinned_to(replica_id)
        if entry.health != ReplicaHealth.DRAINING or pinned:
            return ActorError(
                StatusCode.FAILED_PRECONDITION,
                f"replica {clip_id(replica_id)} is {entry.health.name.lower()} with {pinned} "
                "sessions pinned; only a drained, empty replica can be retired",
            )
        self.replicas.retire(replica_id)
        return True
