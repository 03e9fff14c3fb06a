"""Fault-injection soak: thousands of misbehaving sessions while replicas, the router and
checkpoint stores are SIGKILLed, replicas SIGSTOPped, and migrations and drains lose their
replicas part-way, at random times; then the cluster must heal with nothing lost, doubled or
leaked.

    .venv/bin/python -m bench.chaos --sessions 2000 --replica-kills 4 --router-kills 2 \
        --store-kills 2 --replica-stops 2 --migration-kills 2 --drain-kills 1
    .venv/bin/python -m bench.chaos --quick   # every kind of fault once, 120 sessions

It starts a cluster in-process (``Server``, embedded Ray unless one is running), runs at least
``--sessions`` sessions from ``--concurrency`` asyncio clients (``bench/chaos_load.py``: client
cancels, deadlines, bad inputs, barge-ins, abandoned sessions), and makes the faults
(``bench/chaos_faults.py``) when the sessions finished cross random fractions of ``--sessions``;
the load goes on until the last fault has healed, so that every fault has sessions to hit.
Faults come one at a time: the next waits until the last has healed (a store's, once its
replica's sessions are all checkpointed to the new store: two faults inside that window lose
the sessions that had state, as any single copy would). Each
fault lands on something it can hit (a replica holding sessions, a store holding checkpoints, a
session moving) and the report says per kind how many landed and on what. At the end it
checks: every fault asked for hit something; no session was lost (ended ABORTED: with
checkpoints on a replica's death costs none), doubled (held by two replicas at once, beyond a
migration's moment) or left without a checkpoint longer than the bound; every session completed
or ended with a documented status code and no call hung; the cluster is back to ``--replicas``
healthy replicas; every live replica's pools are at capacity with 0 leaked; the router's table
is empty; /metrics lists the live replicas only. It prints the figures (sessions, faults and
what they hit, codes, time to heal) and exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import random
import statistics
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import ray

from bench.chaos_faults import KINDS, Cluster, Hit, faults
from bench.chaos_load import DOCUMENTED, SAFETY_S, Tally, session, unary
from bench.chaos_watch import watch
from protos import session_router_pb2 as pb
from replica.api import PoolSnapshot
from router.client import AsyncSessionClient
from router.config import ServeConfig
from router.ops.serve import quiet_ray_start_up


@dataclass(frozen=True)
class ChaosConfig:
    sessions: int = 2000
    concurrency: int = 32
    replicas: int = 2
    replica_kills: int = 4
    router_kills: int = 2
    store_kills: int = 1  # a dead store is replaced and its sessions checkpointed again
    # the other faults of partial failures: off by default until their runs heal
    # (docs/benchmarks.md)
    replica_stops: int = 0
    migration_kills: int = 0
    drain_kills: int = 0
    seed: int = 0
    heal_timeout_s: float = 120.0
    unprotected_bound_s: float = 60.0  # longest a replica may hold sessions without checkpoints

    @property
    def counts(self) -> dict[str, int]:
        """How many faults of each kind (``KINDS``) the run makes."""
        return {
            "replica": self.replica_kills,
            "router": self.router_kills,
            "store": self.store_kills,
            "stop": self.replica_stops,
            "migration": self.migration_kills,
            "drain": self.drain_kills,
        }


# ``--quick`` (and tests/test_chaos.py): every kind of fault once, in about two minutes
FAULT_COUNTS = (
    "replica_kills",
    "router_kills",
    "store_kills",
    "replica_stops",
    "migration_kills",
    "drain_kills",
)
QUICK = dict(sessions=120, concurrency=12, seed=3, **dict.fromkeys(FAULT_COUNTS, 1))


@dataclass
class ChaosReport:
    config: ChaosConfig
    tally: Tally = field(default_factory=Tally)
    heal_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    hits: dict[str, list[Hit]] = field(default_factory=lambda: {k: [] for k in KINDS})
    lost_by: Counter = field(default_factory=Counter)  # sessions ABORTED from a fault to its heal
    doubled: set[str] = field(default_factory=set)
    unprotected_s: dict[str, float] = field(default_factory=dict)  # longest stretch per replica
    seconds: float = 0.0
    replaced: int = 0
    problems: list[str] = field(default_factory=list)
    leaked: int = 0  # slots leaked (or freed twice) on the live replicas at the end

    def lines(self) -> list[str]:
        t, c = self.tally, self.config

        def codes(counter: Counter) -> str:
            return ", ".join(f"{k} {v}" for k, v in counter.most_common())

        def heal(kind: str) -> str:
            s = self.heal_s[kind]
            return f"{kind} p50 {statistics.median(s):.1f} s, max {max(s):.1f} s" if s else kind

        def landed(kind: str) -> str:
            hits = self.hits[kind]
            where = "; ".join(h.describe() for h in hits)
            return f"{FAULT_NAMES[kind]} {self.landed(kind)}/{c.counts[kind]}" + (
                f" ({where})" if where else ""
            )

        return [
            f"chaos: {sum(t.sessions.values())} sessions from {c.concurrency} clients on "
            f"{c.replicas} replicas (seed {c.seed}) in {self.seconds:.0f} s",
            "faults landed/asked (what they hit): "
            + ", ".join(landed(k) for k in KINDS if c.counts[k] or self.hits[k]),
            f"clients: {codes(t.faults)}",
            f"sessions ended: {codes(t.sessions)}",
            f"sessions lost {self.lost}, doubled {len(self.doubled)}, slots leaked {self.leaked}; "
            "longest unprotected "
            f"{max(self.unprotected_s.values(), default=0.0):.1f} s "
            f"(bound {c.unprotected_bound_s:g} s)",
            f"calls: {sum(t.calls.values())} ({codes(t.calls)}); hung: {t.hung}",
            f"time to heal (fault -> {c.replicas} healthy replicas): "
            + "; ".join(heal(k) for k in KINDS if self.heal_s[k])
            + f"; {self.replaced} replacement replicas started",
            "end state: "
            + (
                "; ".join(self.problems)
                if self.problems
                else "OK: --replicas "
                "healthy, pools at capacity, 0 leaked, router table empty, /metrics live only"
            ),
        ]

    def landed(self, kind: str) -> int:
        """Faults of ``kind`` that hit something (sessions, checkpoints, a move in flight)."""
        return sum(1 for hit in self.hits[kind] if hit.count)

    @property
    def lost(self) -> int:
        """Sessions whose state was gone (their turn ended ABORTED)."""
        return self.tally.sessions["ABORTED"]


FAULT_NAMES = {
    "replica": "replica SIGKILLs",
    "router": "router SIGKILLs",
    "store": "store SIGKILLs",
    "stop": "replica SIGSTOPs",
    "migration": "migration targets killed",
    "drain": "replicas killed while draining",
}


class Admin:
    """The admin calls the faults make through the gateway (their codes are counted)."""

    def __init__(self, client: AsyncSessionClient, tally: Tally) -> None:
        self.client, self.tally = client, tally

    async def migrate(self, session_id: str, target: str) -> str:
        request = pb.MigrateSessionRequest(session_id=session_id, target_replica_id=target)
        call = self.client.admin.MigrateSession(
            request, metadata=self.client.metadata, timeout=SAFETY_S
        )
        return (await unary(self.tally, call))[0]

    async def drain(self, replica_id: str) -> str:
        request = pb.DrainReplicaRequest(replica_id=replica_id, migrate=True)
        call = self.client.admin.DrainReplica(
            request, metadata=self.client.metadata, timeout=SAFETY_S
        )
        return (await unary(self.tally, call))[0]


async def load(cluster: Cluster, report: ChaosReport) -> None:
    c = report.config
    client = AsyncSessionClient(cluster.server.grpc_address)
    started, done = itertools.count(), [0]
    rng = random.Random(c.seed)
    admin = Admin(client, report.tally)
    injector = asyncio.create_task(
        faults(cluster, c.counts, c.sessions, done, rng, report, admin, c.heal_timeout_s)
    )

    async def worker() -> None:
        # --sessions at least, and on until the last fault has healed: a fault made after the
        # load ended would find nothing to hit
        while (n := next(started)) < c.sessions or not injector.done():
            await session(client, random.Random(c.seed * 1_000_003 + n), report.tally)
            done[0] += 1

    stop_watching = asyncio.Event()
    watcher = asyncio.create_task(
        watch(cluster, report.doubled, report.unprotected_s, stop_watching)
    )
    await asyncio.gather(*(worker() for _ in range(c.concurrency)))
    await injector  # its last heal is part of the run
    stop_watching.set()
    await watcher
    await client.close()


def metrics_replicas(url: str) -> set[str]:
    """The ``replica`` label values /metrics exports."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return {line.split('replica="')[1].split('"')[0] for line in lines if 'replica="' in line}


def check_end_state(cluster: Cluster, report: ChaosReport) -> None:
    c, server, problems = report.config, cluster.server, report.problems
    deadline = time.monotonic() + c.heal_timeout_s
    # healthy at the router and the controller's own: a replica the controller killed (its
    # start failed) can be listed healthy until the router sees it die
    while True:
        fleet = cluster.fleet()
        live = sorted(cluster.healthy() & set(fleet.replicas))
        if len(live) >= c.replicas and not fleet.starting:
            break
        if time.monotonic() > deadline:
            problems.append(f"only {live} healthy")
            return
        time.sleep(0.2)
    report.replaced = fleet.replicas_replaced
    snaps: list = []
    while time.monotonic() < deadline:  # abandoned sessions end at their idle timeout
        snaps = ray.get([fleet.replicas[r].check_invariant.remote() for r in live], timeout=60)
        at_capacity = all(isinstance(s, PoolSnapshot) and s.at_capacity for s in snaps)
        if at_capacity and ray.get(server.router.session_count.remote()) == 0:
            break
        time.sleep(0.5)
    for r, snap in zip(live, snaps):
        if not isinstance(snap, PoolSnapshot):
            problems.append(f"{r}: invariant check failed: {snap}")
            continue
        report.leaked += sum(abs(p.leaked) for p in snap.pools)
        unsettled = [p for p in snap.pools if p.leaked or p.free + p.cached != p.capacity]
        problems += [f"{r}: {p.describe()}" for p in unsettled]
    if (held := ray.get(server.router.session_count.remote())) != 0:
        ids = {v.replica_id for v in ray.get(server.router.views.remote())}
        ids |= {hit.victim for hits in report.hits.values() for hit in hits}
        ids |= {f"replica-{n}" for n in range(fleet.replicas_replaced + 2 * c.replicas + 8)}
        pinned = {r: ray.get(server.router.pinned_sessions.remote(r)) for r in sorted(ids)}
        where = "; ".join(f"{r}: {', '.join(s)}" for r, s in pinned.items() if s)
        problems.append(f"the router still pins {held} sessions ({where})")
    while (listed := metrics_replicas(server.metrics_url)) != set(live):
        if time.monotonic() > deadline:  # dead replicas leave /metrics after their retention
            problems.append(f"/metrics lists {sorted(listed)}, live are {live}")
            break
        time.sleep(0.5)
    t = report.tally
    missed = [f"{k} {report.landed(k)}/{n}" for k, n in c.counts.items() if report.landed(k) < n]
    if missed:  # a fault that hit nothing tested nothing
        problems.append(f"faults that hit something, of those asked: {', '.join(missed)}")
    if report.lost:
        by = ", ".join(f"{k} {n}" for k, n in report.lost_by.items() if n)
        problems.append(f"{report.lost} sessions lost (ended ABORTED; during faults: {by})")
    if report.doubled:
        problems.append(f"{len(report.doubled)} sessions held by two replicas at once")
    if (longest := max(report.unprotected_s.values(), default=0.0)) > c.unprotected_bound_s:
        problems.append(f"sessions unprotected for {longest:.0f} s on one replica")
    if t.hung:
        problems.append(f"{t.hung} calls hung until their safety deadline")
    odd = {code for code in [*t.calls, *t.sessions] if code not in DOCUMENTED}
    odd -= {"completed", "left to the idle timeout"}
    if odd:
        problems.append(f"undocumented status codes: {sorted(odd)}")


def run_chaos(config: ChaosConfig, namespace: str | None = None) -> ChaosReport:
    serve = ServeConfig.from_flags(
        replicas=config.replicas,
        max_sessions=16,
        kv_tokens=16384,
        max_context=1024,
        grpc_port=0,
        metrics_port=0,
        http_port=0,
        strict=True,
        session_idle_timeout_s=3.0,
        open_timeout_s=5.0,
        stale_after_s=3.0,
        dead_replica_retention_s=3.0,
        namespace=namespace or f"chaos-{os.getpid()}",
    )
    own_ray = not ray.is_initialized()
    if own_ray:  # quiet: the SIGKILLs make Ray log every death at length
        quiet_ray_start_up()
        ray.init(
            address="local",  # its own: never a cluster named in Ray's current-cluster file
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            _node_ip_address="127.0.0.1",
        )
    cluster, report = Cluster(serve), ChaosReport(config)
    cluster.call(cluster.server.start())
    try:
        started = time.monotonic()
        asyncio.run(load(cluster, report))
        report.seconds = time.monotonic() - started
        check_end_state(cluster, report)
    finally:
        cluster.call(cluster.server.stop())
        cluster.loop.call_soon_threadsafe(cluster.loop.stop)
        if own_ray:
            ray.shutdown()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"a short run: {QUICK}")
    for name, default in vars(ChaosConfig()).items():
        flag, kind = "--" + name.replace("_", "-"), type(default)
        parser.add_argument(flag, type=kind, default=None, help=f"default {default}")
    args = vars(parser.parse_args(argv))
    given = {k: v for k, v in args.items() if v is not None and k != "quick"}
    report = run_chaos(ChaosConfig(**({**QUICK, **given} if args["quick"] else given)))
    print("\n".join(report.lines()), flush=True)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
