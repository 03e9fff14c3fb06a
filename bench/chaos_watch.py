"""The watcher of ``bench/chaos.py``: while the faults are made it samples every healthy
replica's sessions and snapshot. A session held by two replicas in two samples in a row is
doubled (a migration holds both copies for a moment only); the longest stretch during which a
replica held sessions without a checkpoint is kept per replica."""

from __future__ import annotations

import asyncio
import time

import ray

from bench.chaos_faults import Cluster
from replica.actor.client import ReplicaClient
from replica.api import PoolSnapshot

SAMPLE_S = 0.5
ANSWER_S = 2.0  # a replica that does not answer within this is stopped or dying: left out


async def held_by(cluster: Cluster) -> tuple[dict[str, set[str]], dict[str, int]]:
    """Each healthy replica's sessions, and how many of them are unprotected (no checkpoint);
    a replica that does not answer at once is left out."""
    server, held, unprotected = cluster.server, {}, {}
    replicas = (await server.controller.fleet_view()).replicas
    for replica_id in await asyncio.to_thread(cluster.healthy):
        handle = replicas.get(replica_id)
        if handle is None:
            continue
        replica = ReplicaClient(handle)
        try:
            sessions = await asyncio.wait_for(replica.list_sessions(), ANSWER_S)
            snapshot = await asyncio.wait_for(replica.snapshot(exact=False), ANSWER_S)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            continue  # stopped or dying: not a holder we can read
        if isinstance(sessions, dict):
            held[replica_id] = set(sessions)
        if isinstance(snapshot, PoolSnapshot):
            unprotected[replica_id] = snapshot.checkpoints.unprotected
    return held, unprotected


async def watch(
    cluster: Cluster,
    doubled: set[str],
    unprotected_s: dict[str, float],
    stop: asyncio.Event,
) -> None:
    """Until ``stop``: sessions held by two replicas in two samples in a row go to ``doubled``;
    ``unprotected_s`` keeps, per replica, the longest stretch during which it held sessions
    without a checkpoint."""
    seen_twice: set[str] = set()
    since: dict[str, float] = {}
    while not stop.is_set():
        held, unprotected = await held_by(cluster)
        now_s = time.monotonic()
        for replica_id, n in unprotected.items():
            if n == 0:
                since.pop(replica_id, None)
                continue
            start = since.setdefault(replica_id, now_s)
            unprotected_s[replica_id] = max(unprotected_s.get(replica_id, 0.0), now_s - start)
        counts: dict[str, int] = {}
        for sessions in held.values():
            for session_id in sessions:
                counts[session_id] = counts.get(session_id, 0) + 1
        now = {sid for sid, n in counts.items() if n > 1}
        doubled |= now & seen_twice
        seen_twice = now
        await asyncio.sleep(SAMPLE_S)
