"""``LostReplicas``: the failover of a replica that died while the router did not know it.

A router that Ray restarts starts with empty tables and learns its replicas and their sessions
from the replicas themselves (they register again with what they hold). A replica that died
before (or while) the router restarted never registers again, so nothing in the new router knows
its sessions; if its failover was running when the router died, the sessions it had not
restored yet would be lost with no error anywhere. The controller knows the replica (it started
it) and its checkpoint store, and hands both over with ``recover`` once every live replica is
back in the router's table.

``recover`` asks the store which sessions it still holds (a failover tells the store which ones
it restored: ``CheckpointStore.handed_over``) or knows to hold nothing yet, pins those the table
does not know to the dead replica (a blank one as opened empty), and declares it dead: the
ordinary failover then restores them, or opens the blank ones again empty. A session the table
knows (it lives on a replica that registered it) is never restored twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from replica.api import ReplicaDescription
from replica.checkpoints.store_client import CheckpointStoreClient
from router.control.failover import STORE_WAIT_S
from router.control.registry import ReplicaRegistry
from router.control.table import BlankOpen, SessionTable

log = logging.getLogger(__name__)


class LostReplicas:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        sessions: SessionTable,
        declare_dead: Callable[[str, str], Awaitable[Any]],
    ) -> None:
        self.replicas = replicas
        self.sessions = sessions
        self.declare_dead = declare_dead

    async def recover(
        self, replica_id: str, desc: ReplicaDescription, checkpoints: Any, why: str
    ) -> int:
        """Restore the sessions the dead replica's store ``checkpoints`` holds that no replica
        holds; returns how many were handed to its failover, which then ends the store. A store
        that cannot be reached (a failover ended it) is left alone: 0. A replica the router
        knows is only declared dead (its own failover knows its sessions). Idempotent: a
        second call finds the replica known."""
        try:
            store = CheckpointStoreClient(checkpoints)
            held = await asyncio.wait_for(store.sessions(), STORE_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the store is gone too: nothing to restore
            log.warning("the checkpoint store of lost replica %s: %r", replica_id, exc)
            return 0
        if replica_id in self.replicas:
            await self.declare_dead(replica_id, why)
            return 0
        # registered and declared dead even with nothing to restore: its failover ends the
        # store and removes its files, as any failover does (no handle: it is dead)
        orphans = {sid: held for sid, held in held.items() if sid not in self.sessions}
        entry = self.replicas.register(replica_id, None, desc, checkpoints)
        for sid, (tenant, blank_idle_s) in orphans.items():
            blank = None if blank_idle_s is None else BlankOpen(blank_idle_s, entry.store_epoch)
            self.sessions.pin(sid, replica_id, tenant, blank)
        log.error(
            "replica %s, dead, is not known to this router (%s): %d sessions in its checkpoint "
            "store fail over",
            replica_id,
            why,
            len(orphans),
        )
        await self.declare_dead(replica_id, why)
        return len(orphans)
