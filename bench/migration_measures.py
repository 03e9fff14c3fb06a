"""The measurements of ``bench.migration`` (see its docstring), each on a running local cluster:
migration time against a plain copy through the object store, a drain of a full replica, turn
latency and checkpoint bytes per turn."""

from __future__ import annotations

import math
import time

import numpy as np
import ray

from bench.harness.cluster import LocalCluster
from bench.park_measures import REAL_STATE
from router.client import AsyncSessionClient

HISTORY = 256  # tokens of history of a session that migrates
DRAINED = 64  # sessions on the replica that is drained
DRAIN_HISTORY = 32
TURN_IN, TURN_NEW, TURN_HISTORY = 8, 16, 64


def session_bytes(committed: int) -> int:
    """Bytes of one session's whole state: its live mamba state and the KV of ``committed``
    positions (float32), as ``SessionStates`` carries them."""
    cfg, fp32 = REAL_STATE, 4
    mamba = math.prod(cfg.conv_state_shape) + math.prod(cfg.ssm_state_shape)
    kv = 2 * cfg.num_key_value_heads * cfg.head_dim * committed
    return fp32 * (cfg.num_mamba_layers * mamba + cfg.num_attn_layers * kv)


def history(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 17) % (REAL_STATE.vocab_size - 1) + 1 for i in range(n)]


async def open_with_history(client: AsyncSessionClient, seed: int, n: int) -> tuple[str, str]:
    """A session whose state holds ``n`` tokens (``n - 1`` in, one out): (id, replica)."""
    session = await client.open()
    async for _ in client.generate(
        session.session_id, tokens=history(seed, n - 1), max_new_tokens=1
    ):
        pass
    return session.session_id, session.replica_id


# ----- 1. migration vs a plain copy through the object store ----------------------------------


def _put(actor, nbytes: int):
    """In the source replica: a buffer of ``nbytes`` put in the object store (the buffer is
    made once, before any timing)."""
    buffers = actor.__dict__.setdefault("_bench_buffers", {})
    source = buffers.setdefault(("src", nbytes), np.ones(nbytes, dtype=np.uint8))
    return [ray.put(source)]


def _land(actor, refs) -> int:
    """In the target replica: the object's bytes copied into a buffer of its own."""
    buffers = actor.__dict__.setdefault("_bench_buffers", {})
    data = ray.get(refs[0])
    target = buffers.setdefault(("dst", data.nbytes), np.empty(data.nbytes, dtype=np.uint8))
    np.copyto(target, data)
    return int(target[-1])


async def plain_copy_s(source, target, nbytes: int) -> float:
    """Seconds to move ``nbytes`` from the source replica's process to the target's through
    the object store: put there, got and copied here, two actor calls from the driver."""
    start = time.perf_counter()
    refs = await source.__ray_call__.remote(_put, nbytes)
    await target.__ray_call__.remote(_land, refs)
    return time.perf_counter() - start


async def migration_vs_copy(cluster: LocalCluster, sessions: int) -> tuple[list, list, int]:
    """Each of ``sessions`` sessions with a ``HISTORY``-token history moves from the first
    replica to the second (MigrateSession through the router), and as many bytes take a plain
    copy between the same processes, in turn: (migration seconds, copy seconds, bytes)."""
    router, (first, second) = cluster.server.router, sorted(cluster.replicas)
    handles = cluster.replicas
    client = AsyncSessionClient(cluster.server.grpc_address)
    async with cluster.on_first_replica():
        opened = [await open_with_history(client, 900 + i, HISTORY) for i in range(sessions)]
    nbytes = session_bytes(HISTORY)
    await plain_copy_s(handles[first], handles[second], nbytes)  # warm up both paths
    moves, copies = [], []
    for sid, replica in opened:
        assert replica == first, replica
        start = time.perf_counter()
        route = await router.migrate_session.remote(sid, second)
        moves.append(time.perf_counter() - start)
        assert route.replica_id == second, route
        copies.append(await plain_copy_s(handles[first], handles[second], nbytes))
    for sid, _ in opened:
        await client.close_session(sid)
    await client.close()
    return moves, copies, nbytes


# ----- 2. drain of a replica holding 64 sessions ----------------------------------------------


async def drain_s(cluster: LocalCluster) -> tuple[float, int, int]:
    """DrainReplica(migrate=true) of the first replica holding ``DRAINED`` sessions (each with a
    ``DRAIN_HISTORY``-token history): (seconds, sessions migrated, sessions left)."""
    router, first = cluster.server.router, sorted(cluster.replicas)[0]
    client = AsyncSessionClient(cluster.server.grpc_address)
    async with cluster.on_first_replica():
        opened = [await open_with_history(client, i, DRAIN_HISTORY) for i in range(DRAINED)]
    start = time.perf_counter()
    drained = await router.drain.remote(first, True, 600.0)
    seconds = time.perf_counter() - start
    await router.resume.remote(first)
    for sid, _ in opened:
        await client.close_session(sid)
    await client.close()
    return seconds, drained.sessions_migrated, drained.sessions_left


# ----- 3. and 4. turn latency and checkpoint bytes per turn -----------------------------------


async def turn_latencies(cluster: LocalCluster, turns: int) -> tuple[list[float], float]:
    """One session's turns back to back (``TURN_IN`` tokens in, ``TURN_NEW`` out) through the
    gateway, each from its submission to its last chunk: (seconds per turn, checkpoint bytes
    written per turn on its replica)."""
    client = AsyncSessionClient(cluster.server.grpc_address)
    sid, replica = await open_with_history(client, 7, TURN_HISTORY)
    handle = cluster.replicas[replica]
    before = (await handle.snapshot.remote(True)).checkpoints
    seconds = []
    for n in range(turns):
        start = time.perf_counter()
        async for _ in client.generate(sid, tokens=history(n, TURN_IN), max_new_tokens=TURN_NEW):
            pass
        seconds.append(time.perf_counter() - start)
    after = (await handle.snapshot.remote(True)).checkpoints
    await client.close_session(sid)
    await client.close()
    return seconds, (after.bytes_written_total - before.bytes_written_total) / turns
