"""``ReplicaSupervisor``: keeps the cluster at ``--replicas`` live replicas.

Every ``interval_s`` it compares the fleet's replicas with the router's views. A replica the
router declares DEAD (a failed call, its engine loop died, stale snapshots), or one the router
does not list that does not answer ``ping`` (it died unknown to the router: the router restarted
before or while it died), is killed for good (its process may live on with a dead engine,
holding its GPU) and leaves the fleet; replacements with fresh ids are started until the target
count is live again (a replacement joins empty). The fleet keeps a dead replica's store and
description until the router no longer lists it: then (its failover ended and was forgotten, or
the router restarted before it ended) it is handed with its store to the router
(``LostReplicas``), whose failover restores the sessions that the store holds and no live
replica does, and forgotten. That waits until every live replica the router does not list has
registered again with its sessions (seconds; at most ``LOST_WAIT_S``), so that no session is
restored twice; a round with nothing left to wait for tells the router that every replica is
accounted for (routes of sessions it does not know wait until then). Replicas added beyond the
target are left alone. Failures (a replacement cannot be scheduled, the router is restarting)
are logged and retried on the next round. With checkpoints on, each round then has the
``StoreKeeper`` replace the dead checkpoint stores of live replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from replica.actor.client import ReplicaClient
from replica.api import ActorError
from router.control.api import ReplicaHealth, ReplicaView
from router.control.client import RouterClient
from router.control.fleet import Fleet, kill
from router.control.periodic import Periodic
from router.control.store_keeper import StoreKeeper

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 5.0
LOST_WAIT_S = 30.0  # how long lost replicas wait for unlisted live ones to register again


class ReplicaSupervisor:
    def __init__(
        self,
        fleet: Fleet,
        views: Callable[[], Awaitable[list[ReplicaView] | ActorError]],
        target: int,
        interval_s: float = 1.0,
        stores: StoreKeeper | None = None,
    ) -> None:
        """``fleet``: the replicas it judges (those still starting are not judged yet) and
        replaces; ``target``: the live replicas it keeps (the autoscaler changes it)."""
        self.fleet = fleet
        self.views = views
        self.target = target
        self.stores = stores
        self.replaced = 0
        self._buried_at: dict[str, float] = {}  # dead replicas not handed over yet: since when
        self.rounds = Periodic("restoring the replica count", self.reconcile, interval_s)

    def start(self) -> None:
        self.rounds.start()

    async def stop(self) -> None:
        await self.rounds.stop()

    async def reconcile(self) -> None:
        """One round: kill and forget dead replicas, replace dead stores, start replacements."""
        views = await self.views()
        if isinstance(views, ActorError):
            return  # the router is restarting: nothing is known to be dead
        health = {view.replica_id: view.health for view in views}
        fleet = self.fleet
        judged = [r for r in fleet.replicas if r not in fleet.starting]
        unlisted = [r for r in judged if r not in health]
        answers = await asyncio.gather(*(self._answers(r) for r in unlisted))
        coming_back = [r for r, answered in zip(unlisted, answers) if answered]
        for replica_id in judged:
            lost = replica_id in unlisted and replica_id not in coming_back
            if lost or health.get(replica_id) == ReplicaHealth.DEAD:
                kill(fleet.bury(replica_id))
                self._buried_at[replica_id] = time.monotonic()
                log.warning("replica %s is dead: killed, a replacement starts", replica_id)
        for replica_id in fleet.buried():
            if replica_id in health:
                continue  # the router knows it dead: its failover is the router's
            waited = time.monotonic() - self._buried_at.get(replica_id, 0.0)
            if not coming_back or waited > LOST_WAIT_S:
                await self._hand_over(replica_id)
        if not coming_back and not [r for r in fleet.buried() if r not in health]:
            await RouterClient(fleet.router).replicas_accounted(retry=False)
        if self.stores is not None:
            await self.stores.reconcile(
                [r for r, h in health.items() if h != ReplicaHealth.DEAD and r in fleet.replicas]
            )
        missing = self.target - len(fleet.replicas)
        if missing > 0:
            started = await fleet.start(missing)
            self.replaced += len(started)

    async def _hand_over(self, replica_id: str) -> None:
        """Give the router a dead replica it does not list (it restarted, or forgot the replica
        after its failover), with its store: the failover of the sessions that no live replica
        holds and the store still does (that failover ends the store); then forget it. Kept for
        the next round when the router does not answer."""
        fleet = self.fleet
        store = fleet.stores.get(replica_id)
        if store is not None:
            restored = await RouterClient(fleet.router).recover_replica(
                replica_id=replica_id,
                desc=fleet.descs[replica_id],
                checkpoints=store,
                why="it died while the router was away",
                retry=False,
            )
            if isinstance(restored, ActorError):
                log.warning("handing dead replica %s to the router: %s", replica_id, restored)
                return
            if restored:
                log.warning("replica %s died unknown to the router: %d sessions fail over",
                            replica_id, restored)  # fmt: skip
        fleet.pop(replica_id)
        self._buried_at.pop(replica_id, None)

    async def _answers(self, replica_id: str) -> bool:
        """A replica the router does not list: alive unless it fails to answer ``ping``."""
        try:
            ping = ReplicaClient(self.fleet.replicas[replica_id]).ping()
            return bool(await asyncio.wait_for(ping, timeout=PING_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - an actor that cannot answer is dead
            return False
