"""The cluster side of ``bench/chaos.py``: the cluster under test, on its own event loop thread,
and the faults injected into it (SIGKILLs of replica processes and of the router's process, at
random points of the run, each timed until the cluster has healed)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time

import ray

from router.config import ServeConfig
from router.control.views import ReplicaHealth
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


def pid_of(handle) -> int:
    return ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()), timeout=30)


async def faults(
    cluster: Cluster,
    kills: dict[str, int],
    sessions: int,
    done: list[int],
    rng: random.Random,
    heal_s: dict[str, list[float]],
) -> None:
    """SIGKILL a replica or the router (``kills``: how many of each) when the sessions finished
    (``done[0]`` of ``sessions``) cross random fractions of the run; after each kill, wait until
    the cluster is back to ``--replicas`` healthy replicas without the victim, and record how long
    that took in ``heal_s``."""
    replicas = cluster.server.config.replicas
    plan = sorted((rng.uniform(0.1, 0.8), kind) for kind, n in kills.items() for _ in range(n))
    for fraction, kind in plan:
        while done[0] < fraction * sessions:
            await asyncio.sleep(0.05)
        server = cluster.server
        if kind == "replica":
            victim = rng.choice(sorted(await asyncio.to_thread(cluster.healthy)) or [None])
            if victim is None or victim not in server.replicas:
                continue
            handle = server.replicas[victim]
        else:
            victim, handle = "router", server.router
        os.kill(await asyncio.to_thread(pid_of, handle), signal.SIGKILL)
        killed = time.monotonic()

        def healed(victim=victim) -> bool:
            live = cluster.healthy()
            return len(live) >= replicas and victim not in live

        while not await asyncio.to_thread(healed):
            await asyncio.sleep(0.1)
        heal_s[kind].append(time.monotonic() - killed)
