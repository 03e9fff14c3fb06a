"""``StoreKeeper``: every live replica has a live checkpoint store (``--session-checkpoints``).

Each round of the ``ReplicaSupervisor`` it probes the store of every live replica (not starting,
not declared dead); a store that is known dead (Ray's actor-died error: its process was killed
or its node died) is replaced at once by a new one (``router.control.checkpoint_stores.
start_store``): the router is told first (a failover reads the new store; its store epoch is
one more), then the new store follows the replica, so that the router's epoch never lags the
store that follows (``router.control.blank_reopen``). The replica then checkpoints every session
it holds again at once; until those checkpoints land its sessions count as ``unprotected``, and
those holding committed state as ``let_go`` (a failover never opens them again empty). A store
that is only slow is left alone; once the replica's own stall bound ended its stream, the store
follows it again, from nothing. Failures (the replica died meanwhile) are logged and retried on
the next round. ``replaced`` counts the stores started this way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

import ray

from replica.actor.client import ReplicaClient
from replica.checkpoints.store_client import CheckpointStoreClient
from router.control.checkpoint_stores import start_store
from router.control.client import RouterClient
from router.control.fleet import Fleet

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 5.0
DEAD, IDLE, FOLLOWING = "dead", "idle", "following"  # what a probe finds a store doing


class StoreKeeper:
    def __init__(self, fleet: Fleet, router: RouterClient) -> None:
        """``fleet``: the replicas whose stores it keeps (its ``stores`` map is updated here; a
        new store writes to the deployment's ``--checkpoint-dir`` too, if set)."""
        self.fleet = fleet
        self.replicas = fleet.replicas
        self.stores = fleet.stores
        self.starting = fleet.starting
        self.router = router
        self.replaced = 0
        self.generations: dict[str, int] = {}  # replica id -> stores it has had, less one

    async def reconcile(self, live: Iterable[str]) -> None:
        """Replace the dead stores of the ``live`` replicas; have a live store that stopped
        following its (live) replica follow again."""
        ids = [r for r in live if r in self.stores and r not in self.starting]
        states = await asyncio.gather(*(self._state(self.stores[r]) for r in ids))
        for replica_id, state in zip(ids, states):
            try:
                if state == DEAD:
                    await self._replace(replica_id)
                elif state == IDLE:
                    await self._follow_again(replica_id)
            except Exception as exc:  # noqa: BLE001 - the next round tries again
                log.warning("the checkpoint store of %s: %s", replica_id, exc)

    async def _state(self, store: Any) -> str:
        try:
            following = await asyncio.wait_for(
                CheckpointStoreClient(store).following(), PROBE_TIMEOUT_S
            )
        except ray.exceptions.ActorDiedError:
            return DEAD
        except Exception:  # noqa: BLE001 - slow or unreachable for now, not known dead
            return FOLLOWING
        return FOLLOWING if following else IDLE

    async def _follow_again(self, replica_id: str) -> None:
        """The replica ended the stream (acknowledgements stalled); if it is alive, the store
        follows it again (a dead one's failover reads what the store kept)."""
        replica = self.replicas[replica_id]
        if not await asyncio.wait_for(ReplicaClient(replica).ping(), PROBE_TIMEOUT_S):
            return
        desc = await ReplicaClient(replica).describe()
        store = CheckpointStoreClient(self.stores[replica_id])
        await store.follow(replica=replica, replica_node=desc.node_id)
        self.replaced += 1
        log.warning("the checkpoint store of %s stalled: it follows again", replica_id)

    async def _replace(self, replica_id: str) -> None:
        log.warning("the checkpoint store of %s died: starting a new one", replica_id)
        replica = self.replicas[replica_id]
        desc = await ReplicaClient(replica).describe()
        self.generations[replica_id] = generation = self.generations.get(replica_id, 0) + 1
        cfg = self.fleet.config
        store = await start_store(
            replica_id,
            replica,
            desc.node_id,
            cfg.namespace,
            generation,
            cfg.router.checkpoint_dir,
            follow=False,
        )
        # the router counts the new store epoch before the store follows: a session opened
        # empty from then on is one the new store has followed since before its first turn's
        # end (a failover may open it again, empty, when that store has no checkpoint of it)
        taken = await self.router.replace_checkpoint_store(replica_id=replica_id, store=store)
        if taken is not True:
            ray.kill(store, no_restart=True)  # the replica died meanwhile: its failover is done
            return
        self.stores[replica_id] = store
        await CheckpointStoreClient(store).follow(replica=replica, replica_node=desc.node_id)
        self.replaced += 1
        log.warning("a new checkpoint store follows %s", replica_id)
