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
import sys
import time

import ray

from bench.chaos_config import QUICK, ChaosConfig
from bench.chaos_faults import Cluster, faults
from bench.chaos_load import SAFETY_S, Tally, session, unary
from bench.chaos_report import ChaosReport, check_end_state
from bench.chaos_watch import watch
from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient
from router.config import ServeConfig
from router.ops.serve import quiet_ray_start_up


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
