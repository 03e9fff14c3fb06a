"""Tokens delivered: gRPC clients vs the replica actor vs the engine in-process, side by side.

64 concurrent sessions on ONE replica, each generating 64 tokens per turn (8-token prompt,
greedy), a turn on every session at once per round; the first round of each run warms up. Three
ways in one run, interleaved per repetition:

  gRPC         AsyncSessionClient in a child process -> gateway -> replica actor (other
               replicas draining, so the router places every session on the first)
  actor        straight on the replica actor from this process, one output stream (its socket)
  in-process   the Engine on this thread

plus the CPU each run cost, per process group (this process: the gateway and the drivers; the
client process; the replica actor; the router actor; the rest of Ray), per 1,000 tokens. Goal:
gRPC tokens/s >= 0.8x the in-process engine's.

Run: ``python -m bench.tokens [--quick] [--threads N]``.
"""

from __future__ import annotations

import argparse

from bench.harness import runner
from bench.harness.cluster import LocalCluster
from bench.harness.cpu import CpuMeter
from bench.harness.direct_driver import DirectDriver
from bench.harness.inprocess_driver import InProcessDriver, build_engine
from bench.harness.metered_runs import MeteredRuns
from bench.harness.report import Goal, Table
from bench.harness.stats import Spread, ratios
from bench.harness.workload import TokenRounds

SESSIONS = 64
NEW_TOKENS = 64
PATHS = ("gRPC", "actor", "in-process")
GOAL_GRPC_VS_INPROCESS = 0.8


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    rounds = 2 if args.quick else 3
    grpc = await cluster.grpc()
    direct = DirectDriver(cluster.handles[:1])
    inproc = InProcessDriver(build_engine(cluster.replica_config))
    metered = MeteredRuns(CpuMeter({grpc.pid: "client"}), PATHS)

    async def in_process() -> TokenRounds:  # on this thread: the event loop waits meanwhile
        return inproc.token_rounds(SESSIONS, NEW_TOKENS, rounds)

    try:
        for _ in range(args.repeats):
            async with cluster.on_first_replica():
                await metered.run("gRPC", lambda: grpc.token_rounds(SESSIONS, NEW_TOKENS, rounds))
            await metered.run("actor", lambda: direct.token_rounds(SESSIONS, NEW_TOKENS, rounds))
            await metered.run("in-process", in_process)
    finally:
        direct.stop()
    print_rates(metered, rounds, args.repeats)
    metered.print_cpu()
    rate = {path: metered.rates(path) for path in PATHS}
    print(
        f"\n  actor / in-process tokens/s: {ratios(rate['actor'], rate['in-process']).format()}; "
        f"gRPC / actor: {ratios(rate['gRPC'], rate['actor']).format()}"
    )
    grpc_vs_inproc = ratios(rate["gRPC"], rate["in-process"])
    return [Goal("gRPC / in-process tokens/s", grpc_vs_inproc, GOAL_GRPC_VS_INPROCESS)]


def print_rates(metered: MeteredRuns, rounds: int, repeats: int) -> None:
    runs = metered.runs
    replicas = sorted({r for run in runs["gRPC"] for r in run.replicas})
    print(
        f"\ntokens/s, {SESSIONS} concurrent sessions on one replica (gRPC sessions on "
        f"{', '.join(replicas)}), {NEW_TOKENS} new tokens each per round, {rounds} rounds per "
        f"run (the first warms up), {repeats} run(s) per path"
    )
    table = Table("path", "tokens/s", "vs in-process", "wall s per round (last run)")
    inproc = metered.rates("in-process")
    for path in PATHS:
        rates = metered.rates(path)
        per_round = ", ".join(f"{s:.2f}" for _, s in runs[path][-1].rounds)
        table.add(path, Spread.of(rates).format(",.0f"), ratios(rates, inproc).format(), per_round)
    table.print()


if __name__ == "__main__":
    runner.main(__doc__, measure)
