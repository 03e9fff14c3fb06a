"""The gateway's added latency per RPC, against the gRPC round trip and the actor call alone.

At concurrency 1, on one open session, in one run: ``GetSession`` through gRPC (a client in a
child process -> gateway -> replica actor) vs ``get_session`` straight on the same replica actor
from this process; the difference of their p50s is what the gateway adds. Two floors, measured
alongside: a ``grpc.health`` Check on the same channel (the gRPC round trip alone, Python gRPC at
both ends of loopback, no actor call) and ``ping`` on the replica actor (an actor call that does
no work). The four calls alternate in blocks, so a change of load falls on all of them alike. The
gateway's own work is the added latency less the gRPC round trip. Goal: the gateway adds < 1 ms
per RPC at p50.

Run: ``python -m bench.rpc_latency [--quick]``.
"""

from __future__ import annotations

import argparse
from functools import partial

from bench.harness import runner
from bench.harness.cluster import LocalCluster
from bench.harness.grpc_driver import GrpcDriver
from bench.harness.load import sequential_ms
from bench.harness.report import Goal, Table, number
from bench.harness.stats import Spread, p50, p99

GOAL_ADDED_MS = 1.0
BLOCKS = 10
CALLS = ("GetSession via gRPC", "get_session on the actor", "gRPC health Check", "actor ping")
WHAT = {
    "GetSession via gRPC": "client -> gateway -> replica actor",
    "get_session on the actor": "straight from this process",
    "gRPC health Check": "the gRPC floor: no actor call",
    "actor ping": "the actor floor: no work",
}


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    count = 200 if args.quick else 500
    grpc = await cluster.grpc()
    runs = [await one_repetition(cluster, grpc, count) for _ in range(args.repeats)]

    def p50s(call: str) -> list[float]:
        return [p50(run[call]) for run in runs]

    print(f"\nper-RPC latency at concurrency 1, {count} calls each per repetition")
    table = Table("call", "path", "p50 ms", "p99 ms")
    for call in CALLS:
        pooled = [v for run in runs for v in run[call]]
        table.add(call, WHAT[call], Spread.of(p50s(call)).format(), number(p99(pooled)))
    table.print()
    print("  p50: median (min–max) over repetitions; p99 pooled over them")
    added = [g - d for g, d in zip(p50s(CALLS[0]), p50s(CALLS[1]))]
    own = [a - h for a, h in zip(added, p50s(CALLS[2]))]
    print(
        "\n  gateway added latency (p50 GetSession - p50 get_session): "
        f"{Spread.of(added).format(unit=' ms')}\n  of which the gRPC round trip (health p50): "
        f"{Spread.of(p50s(CALLS[2])).format(unit=' ms')}; "
        f"the gateway's own work: {Spread.of(own).format(unit=' ms')}"
    )
    added_p50 = Spread.of(added)
    return [Goal("gateway added latency per RPC, p50", added_p50, GOAL_ADDED_MS, False, " ms")]


async def one_repetition(
    cluster: LocalCluster, grpc: GrpcDriver, count: int
) -> dict[str, list[float]]:
    """Latencies in ms of each call in ``CALLS`` on a session opened for this repetition, taken
    in ``BLOCKS`` alternating blocks so that a change of load falls on every call alike."""
    session_id, replica_id = await grpc.open_session()
    handle = cluster.replicas[replica_id]
    samples: dict[str, list[float]] = {call: [] for call in CALLS}
    try:
        for _ in range(BLOCKS):
            through = await grpc.rpc_latencies(session_id, count // BLOCKS)
            samples[CALLS[0]] += through.get_session_ms
            samples[CALLS[2]] += through.health_ms
            get_session = partial(handle.get_session.remote, session_id)
            samples[CALLS[1]] += await sequential_ms(get_session, count // BLOCKS)
            samples[CALLS[3]] += await sequential_ms(handle.ping.remote, count // BLOCKS)
    finally:
        await grpc.close_session(session_id)
    return samples


if __name__ == "__main__":
    runner.main(__doc__, measure)
