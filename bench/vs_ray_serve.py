"""session-router vs Ray Serve on the same engine, side by side in one run (issue 13).

The peer (``bench.harness.serve_peer``) is what one would build with Ray Serve: the same Engine
in a deployment of one replica, a queue per session, a streaming ``generate``, and Serve's
``ConsistentHashRouter`` for session affinity; it is called through a ``DeploymentHandle`` from
this process (Serve's router runs in the caller). Ours is the whole stack as a client sees it:
``AsyncSessionClient`` in a child process -> gRPC -> gateway -> replica actor.

1. lifecycles/s at concurrency 64: open, one turn (8-token prompt, 8 new tokens), close.
   Goal: ours >= 2x.
2. tokens/s to 64 streams: 64 open sessions, a turn of 64 new tokens on each at once per round
   (the first round warms up). Goal: ours >= 3x.

Each repetition runs both on both sides, interleaved. Run: ``python -m bench.vs_ray_serve
[--quick]`` (needs ``ray[serve]``, a dev dependency).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from bench.harness import runner
from bench.harness.cluster import LocalCluster
from bench.harness.report import Goal, Table
from bench.harness.serve_peer import ServeDriver, start_peer
from bench.harness.stats import Spread, ratios

CONCURRENCY = 64
STREAMS = 64
NEW_TOKENS = 64
GOAL_LIFECYCLES = 2.0
GOAL_TOKENS = 3.0


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    from ray import serve

    seconds, warmup, rounds = (1.5, 0.3, 2) if args.quick else (2.5, 0.5, 3)
    grpc = await cluster.grpc()
    peer = ServeDriver(start_peer(cluster.replica_config, num_cpus=0.5))
    runs: dict[str, list[float]] = defaultdict(list)
    try:
        await grpc.lifecycles(CONCURRENCY, 0.5, 0.0, 8)  # both paths warm
        await peer.lifecycles(CONCURRENCY, 0.5, 0.0, 8)
        for _ in range(args.repeats):
            runs["ours lifecycles"].append(
                (await grpc.lifecycles(CONCURRENCY, seconds, warmup, 8)).rate
            )
            runs["serve lifecycles"].append(
                (await peer.lifecycles(CONCURRENCY, seconds, warmup, 8)).rate
            )
            async with cluster.on_first_replica():
                ours = await grpc.token_rounds(STREAMS, NEW_TOKENS, rounds)
            runs["ours tokens"].append(ours.rate)
            runs["serve tokens"].append((await peer.token_rounds(STREAMS, NEW_TOKENS, rounds)).rate)
    finally:
        serve.shutdown()
    table = Table("measure", "session-router", "Ray Serve", "ours / Serve")
    table.add(
        f"lifecycles/s at concurrency {CONCURRENCY}",
        Spread.of(runs["ours lifecycles"]).format(".1f"),
        Spread.of(runs["serve lifecycles"]).format(".1f"),
        ratios(runs["ours lifecycles"], runs["serve lifecycles"]).format(),
    )
    table.add(
        f"tokens/s to {STREAMS} streams",
        Spread.of(runs["ours tokens"]).format(",.0f"),
        Spread.of(runs["serve tokens"]).format(",.0f"),
        ratios(runs["ours tokens"], runs["serve tokens"]).format(),
    )
    print("\nsession-router (gRPC, client in a child process) vs Ray Serve (handle) on one engine")
    table.print()
    return [
        Goal(
            "lifecycles/s, ours / Ray Serve",
            ratios(runs["ours lifecycles"], runs["serve lifecycles"]),
            GOAL_LIFECYCLES,
        ),
        Goal(
            "tokens/s to 64 streams, ours / Ray Serve",
            ratios(runs["ours tokens"], runs["serve tokens"]),
            GOAL_TOKENS,
        ),
    ]


if __name__ == "__main__":
    runner.main(__doc__, measure)
