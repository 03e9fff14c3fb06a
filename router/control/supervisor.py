"""``ReplicaSupervisor``: keeps the cluster at ``--replicas`` live replicas.

Every ``interval_s`` it compares the fleet's replicas with the router's views.
A replica the router declares DEAD (a failed call, its engine loop died, stale snapshots), or one
the router no longer lists that does not answer ``ping`` (a router that restarted while it died),
is killed for good (its process may live on with a dead engine, holding its GPU) and forgotten;
then replacements with fresh ids are started until the target count is live again. A replacement
joins empty; the dead replica's series leave /metrics when the router forgets it. Replicas added
beyond the target are left alone. Failures (say a replacement cannot be scheduled) are logged
and retried on the next round. With checkpoints on, each round then has the ``StoreKeeper``
replace the dead checkpoint stores of live replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import ray

from replica.actor.client import ReplicaClient
from replica.api import ActorError
from router.control.api import ReplicaHealth, ReplicaView
from router.control.fleet import Fleet
from router.control.periodic import Periodic
from router.control.store_keeper import StoreKeeper

log = logging.getLogger(__name__)

PING_TIMEOUT_S = 5.0


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
        for replica_id in [r for r in fleet.replicas if r not in fleet.starting]:
            if health.get(replica_id) == ReplicaHealth.DEAD or (
                replica_id not in health and not await self._answers(replica_id)
            ):
                handle = fleet.replicas.pop(replica_id)
                try:
                    ray.kill(handle, no_restart=True)
                except Exception as exc:  # noqa: BLE001 - already gone
                    log.info("kill of dead replica %s: %s", replica_id, exc)
                log.warning("replica %s is dead: killed, a replacement starts", replica_id)
        if self.stores is not None:
            await self.stores.reconcile(
                [r for r, h in health.items() if h != ReplicaHealth.DEAD and r in fleet.replicas]
            )
        missing = self.target - len(fleet.replicas)
        if missing > 0:
            started = await fleet.start(missing)
            self.replaced += len(started)

    async def _answers(self, replica_id: str) -> bool:
        """A replica the router does not list: alive unless it fails to answer ``ping``."""
        try:
            ping = ReplicaClient(self.fleet.replicas[replica_id]).ping()
            return bool(await asyncio.wait_for(ping, timeout=PING_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - an actor that cannot answer is dead
            return False
