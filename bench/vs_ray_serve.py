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

Each repetition runs both on both sides, interleaved. Both sides share the box's cores, so the
bench also meters the CPU of every process group during each side's runs (``SideCosts``): the
cores each side kept busy and its CPU per lifecycle and per token, by group. A side that keeps
the cores busy runs at cores ÷ CPU per unit, so where both do, ours ÷ Serve is Serve's CPU per
unit ÷ ours, and the table says what a goal asks of our CPU per unit and where it goes.

Run: ``python -m bench.vs_ray_serve [--quick]`` (needs ``ray[serve]``, a dev dependency).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from bench.harness import runner
from bench.harness.bare_server import BareServer
from bench.harness.cluster import LocalCluster
from bench.harness.cpu import ACTOR_GROUPS, THIS_PROCESS, CpuMeter
from bench.harness.grpc_driver import GrpcDriver
from bench.harness.report import Goal, Table
from bench.harness.serve_peer import ServeDriver, start_peer
from bench.harness.side_costs import SideCosts
from bench.harness.stats import Spread, ratios
from bench.harness.window import LifecycleSamples
from bench.harness.workload import TokenRounds

CONCURRENCY = 64
STREAMS = 64
NEW_TOKENS = 64
GOAL_LIFECYCLES = 2.0
GOAL_TOKENS = 3.0
BARE = "bare gRPC"  # the floor: a grpc.aio server answering at once, the same client
BARE_STEP_S = 0.001  # its turns' chunks, one per tick (bench.lifecycles' floor too)
GROUPS = {  # the actors' processes by the command line Ray gives them
    b"ray::CheckpointStore": "store",
    b"ray::ServeReplica": "serve replica",
    b"ray::ServeController": "serve controller",
    b"ray::ProxyActor": "serve proxy",
}


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    from ray import serve

    seconds, warmup, rounds = (1.5, 0.3, 2) if args.quick else (2.5, 0.5, 3)
    grpc = await cluster.grpc()
    peer = ServeDriver(start_peer(cluster.replica_config, num_cpus=0.5))
    bare_server = await BareServer(BARE_STEP_S).start()
    bare = await GrpcDriver.start(bare_server.address)
    runs: dict[str, list[float]] = defaultdict(list)
    clients = {grpc.pid: "client", bare.pid: "client"}
    costs = SideCosts(CpuMeter(clients, {**ACTOR_GROUPS, **GROUPS}))
    try:
        for driver in (grpc, peer, bare):  # every path warm
            await driver.lifecycles(CONCURRENCY, 0.5, 0.0, 8)
        for _ in range(args.repeats):
            for side, driver in (("ours", grpc), ("serve", peer), (BARE, bare)):
                work = driver.lifecycles(CONCURRENCY, seconds, warmup, 8)
                done = await costs.run(f"{side} lifecycles", work, lifecycles_done)
                runs[f"{side} lifecycles"].append(done.rate)
            async with cluster.on_first_replica():
                work = grpc.token_rounds(STREAMS, NEW_TOKENS, rounds)
                ours = await costs.run("ours tokens", work, tokens_done)
            runs["ours tokens"].append(ours.rate)
            work = peer.token_rounds(STREAMS, NEW_TOKENS, rounds)
            runs["serve tokens"].append((await costs.run("serve tokens", work, tokens_done)).rate)
    finally:
        serve.shutdown()
        bare.stop()
        await bare_server.stop()
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
    print_costs(costs, runs)
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


def lifecycles_done(samples: LifecycleSamples, wall: float) -> float:
    """Lifecycles a run did: its window's rate over the whole run."""
    return samples.rate * wall


def tokens_done(rounds: TokenRounds, wall: float) -> float:
    return rounds.tokens


def print_costs(costs: SideCosts, runs: dict[str, list[float]]) -> None:
    print(
        f"\nCPU by process group, all runs ({THIS_PROCESS}: this process, our gateway or Serve's "
        "handle, router and clients; client: our gRPC client process)"
    )
    costs.print("lifecycle", ["ours lifecycles", "serve lifecycles", f"{BARE} lifecycles"])
    costs.print("token", ["ours tokens", "serve tokens"], scale=1e6, label="µs")
    for what, goal in (("lifecycles", GOAL_LIFECYCLES), ("tokens", GOAL_TOKENS)):
        ours, theirs = (costs.per_unit_ms(f"{side} {what}") for side in ("ours", "serve"))
        measured = ratios(runs[f"ours {what}"], runs[f"serve {what}"]).format()
        print(
            f"  {what}: Serve's CPU per unit ÷ ours {theirs / ours:.2f} (measured ours / Serve "
            f"{measured}); {goal:g}x at these cores asks ours for at most {theirs / goal:.3g} ms "
            f"of CPU per unit, ours is {ours:.3g}"
        )
    floor = costs.per_unit_ms(f"{BARE} lifecycles")
    print(
        f"  floor: a bare grpc.aio server of the same service and the same client cost {floor:.3g}"
        f" ms per lifecycle ({Spread.of(runs[f'{BARE} lifecycles']).format('.0f')}/s), gRPC's "
        "own part of ours"
    )


if __name__ == "__main__":
    runner.main(__doc__, measure)
