"""The cluster side of ``bench/chaos.py``: the cluster under test, on its own event loop thread,
and the faults injected into it at random points of the run, each timed until the cluster has
healed: SIGKILLs of a replica's process, of the router's and of a replica's checkpoint store;
SIGSTOP of a replica (then SIGCONT, once it has been declared dead); a migration whose target is
SIGKILLed as it starts; a drain with migration whose replica is SIGKILLed during it. Meanwhile a
watcher samples every live replica's sessions: a session held by two replicas in two samples in a
row is doubled."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time

import ray

from replica.api import PoolSnapshot
from router.config import ServeConfig
from router.control.api import ReplicaHealth
from router.ops.serve import Server


class Cluster:
    """A ``Server`` on its own event loop thread, so the load's loop never stalls it."""

    def __init__(self, config: ServeConfig) -> None:
        self.server = Server(config)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def call(self, coro, timeout: float = 300.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def views(self) -> list:
        try:
            return ray.get(self.server.router.views.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the router is restarting
            return []

    def healthy(self) -> set[str]:
        return {v.replica_id for v in self.views() if v.health == ReplicaHealth.HEALTHY}

    def fenced(self, replica_id: str) -> bool:
        """The router lists ``replica_id`` DEAD, or no longer at all (it forgot it)."""
        views = self.views()
        health = {v.replica_id: v.health for v in views}
        return bool(views) and health.get(replica_id, ReplicaHealth.DEAD) == ReplicaHealth.DEAD


def progress(line: str) -> None:
    """A line on stderr as the run goes (the report comes at the end, on stdout)."""
    print(f"chaos: {line}", file=sys.stderr, flush=True)


def pid_of(handle) -> int:
    return ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()), timeout=30)


KINDS = ("replica", "router", "store", "stop", "migration", "drain")
STOPPED_MAX_S = 60.0  # a SIGSTOPped replica is continued once fenced, or after this at most


def held_by(cluster: Cluster) -> tuple[dict[str, set[str]], dict[str, int]]:
    """Each healthy replica's sessions, and how many of them are unprotected (no checkpoint);
    a replica that does not answer at once is left out."""
    server, held, unprotected = cluster.server, {}, {}
    for replica_id in cluster.healthy():
        handle = server.replicas.get(replica_id)
        if handle is None:
            continue
        try:
            sessions = ray.get(handle.list_sessions.remote(), timeout=2)
            snapshot = ray.get(handle.snapshot.remote(exact=False), timeout=2)
        except Exception:  # noqa: BLE001 - stopped or dying: not a holder we can read
            continue
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
    """Sessions held by two replicas in two samples in a row (a migration holds both copies
    for a moment only) go to ``doubled``; ``unprotected_s`` keeps, per replica, the longest
    stretch during which it held sessions without a checkpoint."""
    seen_twice: set[str] = set()
    since: dict[str, float] = {}
    while not stop.is_set():
        held, unprotected = await asyncio.to_thread(held_by, cluster)
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
        await asyncio.sleep(0.5)


async def inject(cluster: Cluster, kind: str, rng: random.Random, grpc_admin) -> str | None:
    """Make one fault of ``kind``; returns the replica it hit (None: nothing to hit now)."""
    server = cluster.server
    live = sorted(await asyncio.to_thread(cluster.healthy))
    victim = rng.choice(live) if live else None
    if kind == "router":
        os.kill(await asyncio.to_thread(pid_of, server.router), signal.SIGKILL)
        return "router"
    if victim is None or victim not in server.replicas:
        return None
    handle = server.replicas[victim]
    if kind == "replica":
        os.kill(await asyncio.to_thread(pid_of, handle), signal.SIGKILL)
    elif kind == "store":
        store = server.stores.get(victim)
        if store is None:
            return None
        os.kill(await asyncio.to_thread(pid_of, store), signal.SIGKILL)
        while server.stores.get(victim) is store and victim in server.replicas:
            await asyncio.sleep(0.2)  # healed: serve's keeper started a new store for it
    elif kind == "stop":
        pid = await asyncio.to_thread(pid_of, handle)
        os.kill(pid, signal.SIGSTOP)
        # stopped until fenced: a replica continued before the router saw it stale is healthy
        # again, and the cluster would wait for its replacement forever
        deadline = time.monotonic() + STOPPED_MAX_S
        while not await asyncio.to_thread(cluster.fenced, victim):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    elif kind == "migration":
        others = [r for r in live if r != victim]
        pinned = await asyncio.to_thread(
            ray.get, server.router.pinned_sessions.remote(victim), timeout=10
        )
        if not others or not pinned:
            return None
        target = rng.choice(others)
        moving = asyncio.create_task(grpc_admin.migrate(rng.choice(pinned), target))
        await asyncio.sleep(rng.uniform(0, 0.05))
        os.kill(await asyncio.to_thread(pid_of, server.replicas[target]), signal.SIGKILL)
        await moving
        return target
    elif kind == "drain":
        draining = asyncio.create_task(grpc_admin.drain(victim))
        await asyncio.sleep(rng.uniform(0, 0.2))
        os.kill(await asyncio.to_thread(pid_of, handle), signal.SIGKILL)
        await draining
    return victim


async def faults(
    cluster: Cluster,
    kills: dict[str, int],
    sessions: int,
    done: list[int],
    rng: random.Random,
    heal_s: dict[str, list[float]],
    grpc_admin,
    heal_timeout_s: float,
    unhealed: list[str],
) -> None:
    """Make the faults of ``kills`` (how many of each kind) when the sessions finished
    (``done[0]`` of ``sessions``) cross random fractions of the run; after each, wait until the
    cluster is back to ``--replicas`` healthy replicas without a replica it fenced (a store's
    death fences nothing), and record how long that took in ``heal_s[kind]``. A fault that has
    not healed within ``heal_timeout_s`` ends the faults, said in ``unhealed``."""
    replicas = cluster.server.config.replicas
    plan = sorted((rng.uniform(0.1, 0.8), kind) for kind, n in kills.items() for _ in range(n))
    for fraction, kind in plan:
        while done[0] < fraction * sessions:
            await asyncio.sleep(0.05)
        started = time.monotonic()
        progress(f"{kind} fault at {done[0]}/{sessions} sessions")
        victim = await inject(cluster, kind, rng, grpc_admin)
        if victim is None:
            continue
        fenced = None if kind == "store" else victim

        def healed(fenced=fenced) -> bool:
            live = cluster.healthy()
            return len(live) >= replicas and fenced not in live

        progress(f"{kind} fault made on {victim} in {time.monotonic() - started:.1f} s")
        while not await asyncio.to_thread(healed):
            if time.monotonic() - started > heal_timeout_s:
                unhealed.append(f"{kind} on {victim}: not healed in {heal_timeout_s:.0f} s")
                progress(unhealed[-1])
                return
            await asyncio.sleep(0.1)
        heal_s[kind].append(time.monotonic() - started)
        progress(f"{kind} fault healed in {heal_s[kind][-1]:.1f} s")
