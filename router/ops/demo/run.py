"""``session-router demo``: a local cluster serving a few hundred short sessions.

Starts an embedded Ray with 2 replicas and 2 gateways (``--gateways``), runs short sessions from
16 concurrent clients through them (``router.ops.demo.sessions``: multi-turn Generate whose turns
go through any gateway, Converse with barge-in, a few clients that disconnect mid-stream), then
keeps more sessions open at once than the replicas have GPU slots, so idle ones are parked in host
memory and restored for their turns (``router.ops.demo.parking``). Prints a per-replica table of
the GPU and host pools before, during and after, the sessions/s, the time to first token and the
parks and restores, and exits 0 only when every pool is back at capacity with nothing leaked.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient
from router.config import ServeConfig
from router.flags import add_arguments as add_serve_arguments
from router.flags import from_arguments
from router.ops.demo.parking import run_parking_phase
from router.ops.demo.sessions import Stats, worker
from router.ops.pool_table import render, rows_from_replicas

DEMO_DEFAULTS = ServeConfig.from_flags(
    replicas=2,
    max_sessions=12,
    max_parked_sessions=60,
    mamba_track_buffers=2,
    kv_tokens=8192,
    max_context=512,
    page_size=16,
    session_idle_timeout_s=60.0,
    open_timeout_s=60.0,
    strict=True,
    grpc_port=0,
    metrics_port=0,
    http_port=0,
    host="127.0.0.1",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=300, help="sessions to run")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gateways", type=int, default=2, help="gateways in front of the cluster (serve's + more)"
    )
    parser.add_argument(
        "--parked-sessions",
        type=int,
        default=96,
        help="sessions kept open at once in the parking phase (0: skip it)",
    )
    add_serve_arguments(parser, ServeConfig, DEMO_DEFAULTS)


def pool_table(replicas: list[pb.ReplicaInfo]) -> str:
    return render(rows_from_replicas(replicas))


def held(replicas: list[pb.ReplicaInfo]) -> int:
    """Mamba slots held by sessions or running turns, over every replica."""
    return sum(p.session_held + p.in_use for r in replicas for p in r.pools if p.pool == "mamba")


def at_capacity(replicas) -> bool:
    """Every slot is free or holds a cached state (room: evicted the moment it is needed)."""
    return all(p.free + p.cached == p.capacity for r in replicas for p in r.pools)


async def wait_back_at_capacity(client: AsyncSessionClient, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while True:
        replicas = await client.replicas()
        full = at_capacity(replicas)
        if full or time.monotonic() > deadline:
            return replicas
        await asyncio.sleep(0.5)


async def run_demo(args: argparse.Namespace) -> int:
    from router.ops.gateway_server import GatewayServer  # import Ray after its settings (cli.py)
    from router.ops.serve import Server

    config = from_arguments(ServeConfig, args, DEMO_DEFAULTS)
    pools = config.replica.pools
    print(
        f"demo: starting a local cluster of {config.replicas} replicas ({config.replica.model}, "
        f"{pools.max_sessions} sessions each, {pools.mamba_track_buffers} track buffers)...",
        flush=True,
    )
    server = Server(config)
    await server.start()
    if args.gateways < 1:
        raise ValueError("--gateways must be at least 1")
    more = dataclasses.replace(
        config.gateway, grpc_port=0, metrics_port=0, http_port=0
    )  # any free ports
    extra = [GatewayServer(more, cluster_metrics=False) for _ in range(args.gateways - 1)]
    for gateway in extra:
        await gateway.start(server.router)
    clients = [AsyncSessionClient(g.grpc_address) for g in (server.front, *extra)]
    client = clients[0]
    try:
        print(f"demo: gRPC on {server.grpc_address}, metrics on {server.metrics_url}")
        if extra:
            print(
                f"demo: {len(extra)} more gateway(s) on "
                f"{', '.join(g.grpc_address for g in extra)}: each multi-turn session takes its "
                "turns through gateways chosen at random"
            )
        print()
        print("before:\n" + pool_table(await wait_back_at_capacity(client, 5)) + "\n", flush=True)
        stats, jobs = Stats(), asyncio.Queue()
        for i in range(args.sessions):
            jobs.put_nowait(i)
        started = time.perf_counter()
        workers = [
            asyncio.create_task(worker(clients, jobs, stats, args.seed + i))
            for i in range(args.concurrency)
        ]
        busiest: list[pb.ReplicaInfo] = []
        while not all(w.done() for w in workers):  # keep the busiest moment to show it
            await asyncio.wait(workers, timeout=0.25)
            now = await client.replicas()
            if held(now) > held(busiest):
                busiest, busiest_done = now, stats.done
        if busiest:
            print(
                f"during (the busiest moment seen, {busiest_done}/{args.sessions} sessions done):\n"
                + pool_table(busiest)
                + "\n",
                flush=True,
            )
        await asyncio.gather(*workers)
        elapsed = time.perf_counter() - started
        parking = None
        if args.parked_sessions:
            parking = await run_parking_phase(
                client, server.metrics_url, args.parked_sessions, args.concurrency, args.seed
            )
        after = await wait_back_at_capacity(client, 10)
        print("after:\n" + pool_table(after) + "\n")
        ttft = stats.ttft
        p99 = statistics.quantiles(ttft, n=100)[98] if len(ttft) > 1 else 0.0
        print(
            f"sessions: {stats.done} in {elapsed:.1f} s = {stats.done / elapsed:.1f} sessions/s "
            f"({', '.join(f'{k} {v}' for k, v in sorted(stats.kinds.items()))})"
        )
        if ttft:
            print(
                f"time to first token: p50 {statistics.median(ttft) * 1e3:.1f} ms, "
                f"p99 {p99 * 1e3:.1f} ms over {len(ttft)} turns"
            )
        if parking is not None:
            print(parking.summary())
        leaked = sum(abs(p.leaked) for r in after for p in r.pools)
        full = at_capacity(after)
        ok = full and leaked == 0 and stats.done == args.sessions
        ok = ok and (parking is None or parking.turns == args.parked_sessions)
        print(
            "result: "
            + (
                "OK - every pool is back at capacity (free or cached), 0 slots leaked"
                if ok
                else f"FAILED - at capacity: {full}, leaked: {leaked}"
            )
        )
        return 0 if ok else 1
    finally:
        for c in clients:
            await c.close()
        for gateway in extra:
            await gateway.stop()
        await server.stop()
