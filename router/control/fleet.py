"""``Fleet``: the replica actors of a deployment and their checkpoint stores: starting them,
taking over the ones a deployment already has, and stopping them.

The fleet's maps (replica id -> handle, replica id -> store, ids still starting) are the ones the
supervisor, the store keeper and the autoscaler read and change: they all hold the one ``Fleet``
their controller built. Replicas are detached named actors (``replica-N`` in the namespace), so
that no process's death but their own ends them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from typing import Any

import ray

from replica.actor.client import ReplicaClient
from replica.actor.router_reports import RouterReports
from replica.api import ActorError, ReplicaDescription
from router.config import ServeConfig
from router.control.checkpoint_stores import start_store
from router.control.client import RouterClient
from router.control.reattach import known_replicas
from router.control.scheduling import replica_resources, wait_until_up

log = logging.getLogger(__name__)

REPLICA_SHUTDOWN_TIMEOUT_S = 10.0
DESCRIBE_TIMEOUT_S = 10.0


class Fleet:
    def __init__(self, config: ServeConfig, router: Any) -> None:
        """``config``: the deployment's settings (its replica config with the failpoints of the
        environment it was deployed from already in); ``router``: the router's handle."""
        self.config = config
        self.router = router
        self.replicas: dict[str, Any] = {}
        self.stores: dict[str, Any] = {}  # each replica's current checkpoint store
        self.descs: dict[str, ReplicaDescription] = {}  # a lost one's failover needs its own
        self.starting: set[str] = set()
        self._ids = itertools.count()

    async def adopt(self) -> None:
        """Take over the replicas the router knows (all of those named in the namespace) and
        their current stores, and number new replicas after them. Raises ``ValueError`` when
        the router does not answer."""
        self.replicas.update(await known_replicas(self.router, self.config.namespace))
        stores = await RouterClient(self.router).checkpoint_stores()
        if isinstance(stores, ActorError):
            raise ValueError(f"the deployment's router did not answer: {stores.message}")
        # the router's are the current ones (a replacement has a name of its own); none for a
        # replica: checkpoints off, or its store is gone (the keeper replaces it)
        self.stores.update((r, store) for r, store in stores.items() if r in self.replicas)
        descs = await asyncio.gather(  # a replica that does not answer is judged by the supervisor
            *(asyncio.wait_for(ReplicaClient(h).describe(), DESCRIBE_TIMEOUT_S)
              for h in self.replicas.values()),
            return_exceptions=True,
        )  # fmt: skip
        self.descs.update(
            (r, d) for r, d in zip(self.replicas, descs) if isinstance(d, ReplicaDescription)
        )
        numbers = [int(r.rsplit("-", 1)[1]) for r in self.replicas if r.rsplit("-", 1)[1].isdigit()]
        self._ids = itertools.count(max(numbers, default=-1) + 1)

    async def start(
        self,
        count: int,
        replica_gpus: float | None = None,
        timeout_s: float | None = None,
        failpoints: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Start ``count`` replicas with fresh ids (and their stores) and register them with the
        router; raises ``ReplicaStartError`` (saying why) when they are not up within
        ``timeout_s`` (default: the deployment's bound), removing every one of them.
        ``replica_gpus`` overrides the deployment's ask (a serve that attaches with its own);
        ``failpoints`` are switched on in these replicas on top of the deployment's."""
        from replica.actor import remote_replica_actor

        cfg = self.config
        threads = replica_threads(cfg)
        replica_config = dataclasses.replace(
            cfg.replica, threads=threads, failpoints=cfg.replica.failpoints | failpoints
        )
        gpus = cfg.replica_gpus if replica_gpus is None else replica_gpus
        ask = replica_resources(gpus, cfg.most_replicas)
        ids = [f"replica-{next(self._ids)}" for _ in range(count)]
        self.starting.update(ids)
        try:
            for replica_id in ids:
                self.replicas[replica_id] = (
                    remote_replica_actor()
                    .options(
                        name=replica_id,
                        namespace=cfg.namespace,
                        lifetime="detached",
                        num_gpus=ask["GPU"],
                        num_cpus=ask["CPU"],
                        max_concurrency=10_000,
                    )
                    .remote(replica_id, replica_config, self.router)
                )
            descs = await wait_until_up(
                {r: ReplicaClient(self.replicas[r]).describe() for r in ids},
                ask,
                cfg.replica_start_timeout_s if timeout_s is None else timeout_s,
            )
            self.descs.update(descs)
            if cfg.replica.session_checkpoints:  # all at once: each is a process to start
                stores = await asyncio.gather(*(
                    start_store(r, self.replicas[r], descs[r].node_id, cfg.namespace, 0,
                                cfg.router.checkpoint_dir) for r in ids
                ), return_exceptions=True)  # fmt: skip
                self.stores.update(
                    (r, store)
                    for r, store in zip(ids, stores)
                    if not isinstance(store, BaseException)
                )  # kept so that a failure below removes them too
                for store in stores:
                    if isinstance(store, BaseException):
                        raise store
            snaps = await asyncio.gather(*(ReplicaClient(self.replicas[r]).snapshot() for r in ids))
            for replica_id, snap in zip(ids, snaps):
                await RouterReports(self.router).register_replica(
                    replica_id=replica_id,
                    handle=self.replicas[replica_id],
                    desc=descs[replica_id],
                    tenants={},
                    snapshot=snap,
                    checkpoints=self.stores.get(replica_id),
                )
        except BaseException:
            for replica_id in ids:  # none of them half-started: they would hold resources
                for handle in self.pop(replica_id):
                    if handle is not None:
                        ray.kill(handle, no_restart=True)
            raise
        finally:
            self.starting.difference_update(ids)
        log.info("started %d replicas", count)
        return ids

    def bury(self, replica_id: str) -> Any:
        """A dead replica leaves the fleet (its handle is returned); its store and description
        stay until ``pop``: a failover the router could not finish needs them (``buried``)."""
        return self.replicas.pop(replica_id)

    def buried(self) -> list[str]:
        """The dead replicas whose store and description are kept."""
        return [r for r in self.descs if r not in self.replicas and r not in self.starting]

    def pop(self, replica_id: str) -> tuple[Any, Any]:
        """Forget a replica: its handle and its store's (either None when unknown)."""
        self.descs.pop(replica_id, None)
        return self.replicas.pop(replica_id, None), self.stores.pop(replica_id, None)

    async def stop(self) -> int:
        """Release every replica's sessions, all replicas at once within one bound
        (``REPLICA_SHUTDOWN_TIMEOUT_S`` whatever their count: one at a time took that per
        replica, past a pod's grace period with a few hung ones), then end every replica and
        store actor. Returns how many sessions they released (a replica that is dead or does
        not answer in time counts 0)."""
        pairs = [(h, self.stores.get(r)) for r, h in self.replicas.items()]
        orphans = [s for r, s in self.stores.items() if r not in self.replicas]
        released = sum(await asyncio.gather(*(stop_replica(h, s) for h, s in pairs)))
        for store in orphans:
            kill(store)
        self.replicas.clear()
        self.stores.clear()
        self.descs.clear()
        return released


async def stop_replica(
    handle: Any, store: Any = None, timeout_s: float = REPLICA_SHUTDOWN_TIMEOUT_S
) -> int:
    """Shut a replica down (it releases what it still holds, within ``timeout_s``) and end its
    actor and its checkpoint store; returns the sessions it released (0: dead, or no answer in
    time)."""
    try:
        released = await asyncio.wait_for(ReplicaClient(handle).shutdown(), timeout_s)
    except Exception as exc:  # noqa: BLE001 - a dead replica has nothing to release
        log.warning("replica shutdown failed: %s", exc)
        released = 0
    for actor in (handle, store):
        if actor is not None:
            kill(actor)
    return released


def replica_threads(config: ServeConfig) -> int:
    """Torch threads per replica: the setting, else CPU replicas share the cores (one is left to
    the gateway, the router and Ray)."""
    if config.replica.threads or config.replica_gpus:
        return config.replica.threads or 1
    return max(1, ((os.cpu_count() or 1) - 1) // config.most_replicas)


def kill(handle: Any) -> None:
    """End an actor for good; one already gone (a store its failover ended) is fine."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception as exc:  # noqa: BLE001 - already gone
        log.info("kill of an actor already gone: %s", exc)
