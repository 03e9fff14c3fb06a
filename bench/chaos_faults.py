"""The cluster side of ``bench/chaos.py``: the cluster under test, on its own event loop thread,
and the faults made on it, each on something it can hit and each timed until the cluster has
healed: SIGKILLs of a replica holding sessions, of the router while its table holds sessions and
of a checkpoint store holding checkpoints; SIGSTOP of a replica holding sessions (SIGCONT once
it has been declared dead); a migration whose target is SIGKILLed while the session moves; a
drain with migration whose replica is SIGKILLed while it drains. Each fault says what it hit
(``Hit``); one that found nothing to hit is made again, and one that never does is reported."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass

import ray

from replica.actor.client import ReplicaClient
from replica.api import ActorError, PoolSnapshot
from replica.checkpoints.store_client import CheckpointStoreClient
from router.config import ServeConfig
from router.control.api import FleetView, ReplicaHealth
from router.control.client import RouterClient
from router.ops.serve import Server


class Cluster:
    """A ``Server`` on its own event loop thread, so the load's loop never stalls it."""

    def __init__(self, config: ServeConfig) -> None:
        self.server = Server(config)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def call(self, coro, timeout: float = 300.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def fleet(self) -> FleetView:
        """The controller's replicas, their stores and those starting (from a plain thread)."""
        return self.call(self.server.controller.fleet_view(), timeout=30)

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

    async def pinned(self) -> dict[str, list[str]]:
        """The sessions the router pins to each healthy replica ({} while it restarts)."""
        router, found = RouterClient(self.server.router), {}
        for replica_id in sorted(await asyncio.to_thread(self.healthy)):
            sessions = await router.pinned_sessions(replica_id=replica_id, retry=False)
            if not isinstance(sessions, ActorError):
                found[replica_id] = sessions
        return found


def progress(line: str) -> None:
    """A line on stderr as the run goes (the report comes at the end, on stdout)."""
    print(f"chaos: {line}", file=sys.stderr, flush=True)


def pid_of(handle) -> int:
    return ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()), timeout=30)


async def sigkill(handle) -> None:
    os.kill(await asyncio.to_thread(pid_of, handle), signal.SIGKILL)


KINDS = ("replica", "router", "store", "stop", "migration", "drain")
STOPPED_MAX_S = 60.0  # a SIGSTOPped replica is continued once fenced, or after this at most


@dataclass(frozen=True)
class Hit:
    """What one fault landed on: ``victim`` (a replica, "router", a replica's store) and
    ``count`` of ``what`` there (0: it landed, but on nothing in flight)."""

    victim: str
    count: int
    what: str

    def describe(self) -> str:
        return f"{self.victim}: {self.count} {self.what}"


async def inject(cluster: Cluster, kind: str, rng: random.Random, admin) -> Hit | None:
    """Make one fault of ``kind`` on something it can hit; None (nothing done): there is
    nothing to hit now (no session on a replica, no checkpoint in a store)."""
    server = cluster.server
    pinned = {r: s for r, s in (await cluster.pinned()).items() if s}
    fleet = await server.controller.fleet_view()
    if kind == "router":
        held = await RouterClient(server.router).session_count(retry=False)
        if isinstance(held, ActorError) or held == 0:
            return None
        await sigkill(server.router)
        return Hit("router", held, "sessions in its table")
    if kind == "store":
        held = {}
        for replica_id in pinned:
            if (store := fleet.stores.get(replica_id)) is not None:
                held[replica_id] = (await CheckpointStoreClient(store).stats())[0]
        held = {r: n for r, n in held.items() if n}
        if not held:
            return None
        victim = rng.choice(sorted(held))
        store = fleet.stores[victim]
        await sigkill(store)
        await reprotected(cluster, victim, store)
        return Hit(f"{victim}'s store", held[victim], "checkpoints")
    if not pinned or (kind == "migration" and len(cluster.healthy()) < 2):
        return None
    victim = rng.choice(sorted(pinned))
    handle, sessions = fleet.replicas.get(victim), len(pinned[victim])
    if handle is None:
        return None  # the controller has just replaced it
    if kind == "replica":
        await sigkill(handle)
    elif kind == "stop":
        await stop_until_fenced(cluster, victim, handle)
    elif kind == "migration":
        target = rng.choice(sorted(cluster.healthy() - {victim}))
        session_id = rng.choice(pinned[victim])
        moving = asyncio.create_task(admin.migrate(session_id, target))
        await asyncio.sleep(rng.uniform(0, 0.05))
        mid_way = not moving.done()
        await sigkill(fleet.replicas[target])
        code = await moving
        return Hit(target, int(mid_way), f"session moving in from {victim} ({code})")
    elif kind == "drain":
        draining = asyncio.create_task(admin.drain(victim))
        await asyncio.sleep(rng.uniform(0, 0.2))
        mid_way = not draining.done()
        await sigkill(handle)
        code = await draining
        return Hit(victim, sessions if mid_way else 0, f"sessions draining ({code})")
    return Hit(victim, sessions, "sessions")


async def reprotected(cluster: Cluster, victim: str, dead_store) -> None:
    """Wait until ``victim``'s store is whole again: the controller's keeper started a new one
    and the replica reports every session protected (all checkpointed to it again), or
    ``victim`` is gone. Until then its sessions live on the replica alone, so a second fault
    on it would be a double fault, which loses the sessions with state by design."""
    server = cluster.server
    while (now := await server.controller.fleet_view()).replicas.get(victim) is not None:
        if getattr(now.stores.get(victim), "_actor_id", None) != dead_store._actor_id:
            try:
                snapshot = await ReplicaClient(now.replicas[victim]).snapshot(exact=False)
            except ray.exceptions.RayError:
                return  # the replica died meanwhile: its failover reads the new store
            if isinstance(snapshot, PoolSnapshot) and snapshot.checkpoints.unprotected == 0:
                return
        await asyncio.sleep(0.2)


async def stop_until_fenced(cluster: Cluster, victim: str, handle) -> None:
    """SIGSTOP ``victim`` and keep it stopped until the router has fenced it: a replica
    continued before the router saw it stale is healthy again, and would never be replaced."""
    pid = await asyncio.to_thread(pid_of, handle)
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOPPED_MAX_S
    while not await asyncio.to_thread(cluster.fenced, victim):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def waiting_on(cluster: Cluster) -> str:
    """What a heal is waiting for: the router's view, the controller's replicas, Ray's free
    CPU."""
    fleet = cluster.fleet()
    views = ", ".join(f"{v.replica_id} {v.health.name}" for v in cluster.views())
    return (
        f"not healed yet: router lists {views or 'nothing'}; the controller has "
        f"{sorted(fleet.replicas)} (starting {sorted(fleet.starting)}); Ray has CPU "
        f"{ray.available_resources().get('CPU', 0.0):g} free"
    )


SAY_EVERY_S = 30.0
ATTEMPTS = 3  # a fault that landed on nothing in flight is made again, this many times in all


async def faults(
    cluster: Cluster,
    kills: dict[str, int],
    sessions: int,
    done: list[int],
    rng: random.Random,
    report,
    admin,
    heal_timeout_s: float,
) -> None:
    """Make the faults of ``kills`` (how many of each kind) when the sessions finished
    (``done[0]`` of ``sessions``) cross random fractions of the run; the load goes on until
    this returns. After each, wait until the cluster is back to ``--replicas`` healthy replicas
    without a replica it fenced (a store's death fences nothing), and record how long that took
    in ``report.heal_s[kind]``, what it hit in ``report.hits[kind]`` and the sessions that ended
    ABORTED meanwhile in ``report.lost_by[kind]``. A fault that finds
    nothing to hit within ``heal_timeout_s``, or that has not healed within it, is said in
    ``report.problems``; one not healed ends the faults."""
    replicas = cluster.server.config.replicas
    plan = sorted((rng.uniform(0.1, 0.8), kind) for kind, n in kills.items() for _ in range(n))
    for fraction, kind in plan:
        while done[0] < fraction * sessions:
            await asyncio.sleep(0.05)
        for _ in range(ATTEMPTS):
            progress(f"{kind} fault at {done[0]} sessions done")
            looking = started = time.monotonic()
            while (hit := await inject(cluster, kind, rng, admin)) is None:
                if time.monotonic() - looking > heal_timeout_s:
                    break
                await asyncio.sleep(0.5)
                started = time.monotonic()  # the fault is made from here
            if hit is None:
                report.problems.append(f"{kind} fault: nothing to hit in {heal_timeout_s:.0f} s")
                progress(report.problems[-1])
                break
            report.hits[kind].append(hit)
            aborted = report.tally.sessions["ABORTED"]
            fenced = None if kind == "store" else hit.victim

            def healed(fenced=fenced) -> bool:
                live = cluster.healthy()
                return len(live) >= replicas and fenced not in live

            progress(f"{kind} fault made on {hit.describe()}")
            said = started
            while not await asyncio.to_thread(healed):
                if time.monotonic() - said > SAY_EVERY_S:  # what it waits for
                    said = time.monotonic()
                    progress(await asyncio.to_thread(waiting_on, cluster))
                if time.monotonic() - started > heal_timeout_s:
                    report.problems.append(f"{kind} on {hit.victim}: not healed in "
                                           f"{heal_timeout_s:.0f} s")  # fmt: skip
                    progress(report.problems[-1])
                    return
                await asyncio.sleep(0.1)
            report.heal_s[kind].append(time.monotonic() - started)
            lost = report.tally.sessions["ABORTED"] - aborted
            report.lost_by[kind] += lost
            progress(f"{kind} fault healed in {report.heal_s[kind][-1]:.1f} s; {lost} lost")
            if hit.count:
                break
