"""Tokens delivered over the OpenAI-compatible API (SSE) vs over gRPC, on the same cluster.

64 concurrent streams on ONE replica, each generating 64 tokens (8-token prompt, greedy,
``ignore_eos``) per round; the first round of each run warms up. Two ways, interleaved per
repetition, each from a client in a child process:

  gRPC   AsyncSessionClient: 64 sessions opened once, a Generate turn on each per round
  SSE    httpx: 64 streamed ``POST /v1/completions`` per round (each opens a session, streams
         its turn as server-sent events and closes it: what a stateless client costs)

plus the CPU each cost per 1,000 tokens, per process group (this process runs the gateway: its
gRPC server and its HTTP server share one event loop). Goal: SSE tokens/s >= 0.8x gRPC's.

Run: ``python -m bench.sse [--quick] [--threads N]``.
"""

from __future__ import annotations

import argparse

from bench.harness import runner
from bench.harness.client_process import ClientProcess
from bench.harness.cluster import LocalCluster
from bench.harness.cpu import CpuMeter
from bench.harness.metered_runs import MeteredRuns
from bench.harness.report import Goal, Table
from bench.harness.sse_driver import SseClient, run_sse_rounds
from bench.harness.stats import Spread, ratios
from bench.harness.workload import TokenRounds

SESSIONS = 64
NEW_TOKENS = 64
PATHS = ("gRPC", "SSE")
GOAL_SSE_VS_GRPC = 0.8


async def sse_rounds(sse: ClientProcess, rounds: int) -> TokenRounds:
    return await sse.call(run_sse_rounds, sessions=SESSIONS, new_tokens=NEW_TOKENS, rounds=rounds)


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    rounds = 2 if args.quick else 3
    grpc = await cluster.grpc()
    sse = await ClientProcess.start(cluster.server.front.http_url, connect=SseClient)
    metered = MeteredRuns(CpuMeter({grpc.pid: "grpc client", sse.pid: "sse client"}), PATHS)
    try:
        async with cluster.on_first_replica():
            for _ in range(args.repeats):
                await metered.run("gRPC", lambda: grpc.token_rounds(SESSIONS, NEW_TOKENS, rounds))
                await metered.run("SSE", lambda: sse_rounds(sse, rounds))
    finally:
        sse.stop()
    rate = {path: metered.rates(path) for path in PATHS}
    print(
        f"\ntokens/s, {SESSIONS} concurrent streams on one replica, {NEW_TOKENS} new tokens "
        f"each per round, {rounds} rounds per run (the first warms up), {args.repeats} run(s)"
    )
    table = Table("path", "tokens/s", "vs gRPC")
    for path in PATHS:
        table.add(path, Spread.of(rate[path]).format(",.0f"),
                  ratios(rate[path], rate["gRPC"]).format())  # fmt: skip
    table.print()
    metered.print_cpu()
    return [Goal("SSE / gRPC tokens/s", ratios(rate["SSE"], rate["gRPC"]), GOAL_SSE_VS_GRPC)]


if __name__ == "__main__":
    runner.main(__doc__, measure)
