"""Starting a replica's ``CheckpointStore`` (``--session-checkpoints``), away from its node.

A checkpoint must outlive its replica's process, and on a multi-node cluster its node too: the
store is placed on another alive node than the replica's (a worker node is required when there
is one; a one-node cluster still gets one, on the same node), asks for no CPU, and is named
``<replica id>-checkpoints`` in the cluster's namespace (a replacement
``<replica id>-checkpoints-<n>``). It starts following the replica at once.

Never on the head node while any other node can take it: the head is the node that restarts
(GCS fault tolerance), and an actor there waits for Ray to notice the old head is gone before it
is restarted, empty.
"""

from __future__ import annotations

import itertools
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from replica.actor import CheckpointStore
from replica.checkpoints.store_client import CheckpointStoreClient

_spread = itertools.count()
HEAD_NODE_RESOURCE = "node:__internal_head__"  # the resource Ray gives its head node


def other_node(node_id: str) -> tuple[str, bool] | None:
    """Where the store of a replica on ``node_id`` goes, and whether it must go there (True:
    a worker node): an alive worker node (not the head) that is not ``node_id``, round robin
    among them; else ``node_id`` itself when it is a worker; else any alive node but
    ``node_id`` (preferred only); else None (a one-node cluster)."""
    alive = [n for n in ray.nodes() if n["Alive"]]
    workers = {n["NodeID"] for n in alive if HEAD_NODE_RESOURCE not in n["Resources"]}
    others = sorted(workers - {node_id}) or sorted(workers & {node_id})
    if others:
        return others[next(_spread) % len(others)], True
    others = sorted(n["NodeID"] for n in alive if n["NodeID"] != node_id)
    return (others[next(_spread) % len(others)], False) if others else None


async def start_store(
    replica_id: str,
    replica: Any,
    node_id: str,
    namespace: str,
    generation: int = 0,
    checkpoint_dir: str = "",
    follow: bool = True,
) -> Any:
    """A checkpoint store for the replica ``replica`` (on node ``node_id``), following it
    unless not ``follow`` (the caller then has it follow, ``CheckpointStoreClient.follow``); a
    replacement of a dead one (``generation`` 1, 2, ...) gets a name of its own, as Ray may
    keep a dead actor's name for a while. With ``checkpoint_dir`` it writes there too."""
    name = f"{replica_id}-checkpoints" + (f"-{generation}" if generation else "")
    away = other_node(node_id)
    # a worker node is a must: with a soft affinity a busy raylet spills the store back to
    # another node, the head included (seen on a head restart: that store died with the head)
    strategy = NodeAffinitySchedulingStrategy(away[0], soft=not away[1]) if away else "DEFAULT"
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
        .remote(replica_id, checkpoint_dir)
    )
    if follow:
        await CheckpointStoreClient(store).follow(replica=replica, replica_node=node_id)
    return store
