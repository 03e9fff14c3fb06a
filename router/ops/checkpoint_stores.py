"""Starting a replica's ``CheckpointStore`` (``--session-checkpoints``), away from its node.

A checkpoint must outlive its replica's process, and on a multi-node cluster its node too: the
store is placed on another alive node than the replica's (soft affinity, so a one-node cluster
still gets one, on the same node), asks for no CPU, and is named ``<replica id>-checkpoints``
in the cluster's namespace (a replacement ``<replica id>-checkpoints-<n>``). It starts following
the replica at once.
"""

from __future__ import annotations

import itertools
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from replica.actor import CheckpointStore
from replica.checkpoints.store_client import CheckpointStoreClient

_spread = itertools.count()


def other_node(node_id: str) -> str | None:
    """An alive node that is not ``node_id`` (round robin among them), or None."""
    others = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != node_id)
    return others[next(_spread) % len(others)] if others else None


async def start_store(
    replica_id: str, replica: Any, node_id: str, namespace: str, generation: int = 0
) -> Any:
    """A checkpoint store for the replica ``replica`` (on node ``node_id``), following it; a
    replacement of a dead one (``generation`` 1, 2, ...) gets a name of its own, as Ray may
    keep a dead actor's name for a while."""
    name = f"{replica_id}-checkpoints" + (f"-{generation}" if generation else "")
    away = other_node(node_id)
    strategy = NodeAffinitySchedulingStrategy(away, soft=True) if away else "DEFAULT"
    store = (
        ray.remote(CheckpointStore)
        .options(
            name=name,
            namespace=namespace,
            lifetime="detached",  # outlives the serve that started it, as the replica does
            num_cpus=0,
            max_concurrency=1000,
            scheduling_strategy=strategy,
        )
        .remote(replica_id)
    )
    await CheckpointStoreClient(store).follow(replica=replica, replica_node=node_id)
    return store
