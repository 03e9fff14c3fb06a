"""``ClusterCalls``: the router's calls that change its tables directly, on news from outside
(mixed into ``SessionRouter``): gateways' batched pins and forgets of sessions they opened or
released on a replica themselves, the replicas' handles for those opens, the retirement of a
replica the serve process removes (autoscaling), and a replica's new checkpoint store (its old
one died).
"""

from __future__ import annotations

from typing import Any

from replica.api import ActorError, PoolSnapshot, StatusCode, clip_id
from router.control.api import ReplicaHealth
from router.control.opens import Opener
from router.control.registry import ReplicaRegistry
from router.control.table import BlankOpen, SessionTable


class ClusterCalls:
    replicas: ReplicaRegistry
    sessions: SessionTable
    opener: Opener

    async def update_sessions(
        self,
        pins: list[tuple[str, str, str, float | None]],
        forgets: list[tuple[str, str]],
        snapshots: list[PoolSnapshot],
    ) -> list[bool]:
        """A gateway's batched news (``router.gateway.router_updates``): sessions it opened on a
        replica itself (session id, replica id, tenant, and its idle timeout when it was opened
        empty, else None: ``BlankOpen``), sessions it released on a replica
        (session id, replica id: one pinned to another replica by now, it moved, is kept), and
        the replicas' snapshots from those calls' replies. Per pin, whether it was pinned: False
        when the replica is not a live one here, or has reported the session released (the
        gateway then releases the session). A
        session pinned here is the router's like any other: drains move it, failover restores
        it from its checkpoints."""
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

    async def replica_handles(self) -> dict[str, Any]:
        """The actor handle of every live replica, by id (gateways open sessions on them)."""
        return self.replicas.live_handles()

    async def checkpoint_stores(self) -> dict[str, Any]:
        """Every live replica's current checkpoint store, by replica id (a serve taking over the
        deployment supervises them; a replacement's name is not the first store's)."""
        return self.replicas.live_stores()

    async def replace_checkpoint_store(self, replica_id: str, store: Any) -> bool:
        """``store`` now keeps ``replica_id``'s checkpoints (its failover reads them there); False
        when the replica is not a live one here (the caller ends ``store``)."""
        entry = self.replicas.get(replica_id)
        if entry is None or entry.health == ReplicaHealth.DEAD:
            return False
        if store != entry.checkpoints:
            entry.checkpoints, entry.store_epoch = store, entry.store_epoch + 1
        return True

    async def retire_replica(self, replica_id: str) -> bool | ActorError:
        """Forget a draining replica that holds no session, before the serve process stops it:
        it leaves ListReplicas and /metrics at once, never counted as dead, and may not register
        again. Refused (FAILED_PRECONDITION) while it is not draining or sessions are pinned to
        it."""
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
