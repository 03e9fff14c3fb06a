"""Session lifecycles: what the gateway and Ray cost per session, measured side by side.

One lifecycle is OpenSession, one turn (8-token prompt, 8 new tokens, greedy) and CloseSession.
Closed loops at concurrency 1, 16 and 64 (each worker starts its next lifecycle when the last
ends), three ways in one run, interleaved per concurrency and repetition so that load from
elsewhere falls on all three alike:

  gateway     AsyncSessionClient over loopback gRPC, in a child process -> gateway -> replica
              actor (open, submit, close) and router actor (pin, forget): 5 actor calls
  direct      the same calls straight on the replica actors from this process, with one
              long-lived output stream per replica (its socket), as a gateway keeps: 3 actor calls
  in-process  the Engine on this thread, stepping until the turn ends: no Ray, no gRPC

The yardstick, in the same run: raw async actor calls (``ping`` on a replica actor), their
latency one at a time and their rate with 16 and 64 in flight, and what share of that ceiling
each path's lifecycles/s reach. And the floor of the gateway path's gRPC half: the same client
process against a bare grpc.aio server of the same service in this process
(``bench.harness.bare_server``: open and close answered at once, the turn's 8 chunks streamed
one per 1 ms tick), at concurrency 64. On a box whose cores every process shares, the gateway
path costs at least the direct path's work plus what gRPC costs the client and a server, so
gateway / direct is at most bare / (bare + direct) in lifecycles/s. And the gateway with its
64 clients in lockstep (``run_lockstep_rounds``: rounds of lifecycles started together), which
the direct driver's workers fall into by themselves and independent gRPC clients do not: what
of the gap is their drift (smaller batches of calls and forwards). Goal (issue 13): gateway /
direct lifecycles/s >= 0.8 at 64.

Where the rest goes (``bench.harness.lifecycle_costs``), for the gateway and direct runs at 64:
the CPU each process group spent per lifecycle, the actor calls per lifecycle of the path's
call batchers with the requests each carried (the batch size), and the replicas' engine forwards
per lifecycle with the rows each ran (from their snapshots' ``StepStats``).

Run: ``python -m bench.lifecycles [--quick] [--threads N] [--replicas N]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict

from bench.harness import runner
from bench.harness.bare_server import BareServer
from bench.harness.cluster import LocalCluster
from bench.harness.cpu import ACTOR_GROUPS, CpuMeter
from bench.harness.direct_driver import DirectDriver
from bench.harness.grpc_driver import GrpcDriver
from bench.harness.inprocess_driver import InProcessDriver, build_engine
from bench.harness.lifecycle_costs import LifecycleCosts
from bench.harness.load import calls_per_second, sequential_ms
from bench.harness.report import Goal, Table, number, ratio
from bench.harness.stats import Spread, p50, p99, ratios
from bench.harness.window import LifecycleSamples
from bench.harness.workload import PROMPT
from replica.actor.client import ReplicaClient
from replica.api import StepStats

NEW_TOKENS = 8
CONCURRENCY = (1, 16, 64)
MODES = ("gateway", "direct", "in-process")
ACTOR_CALLS = {"gateway": 5, "direct": 3}  # per lifecycle, besides the stream items
GOAL_GATEWAY_VS_DIRECT = 0.8  # lifecycles/s at concurrency 64 (issue 13)
BARE = "bare gRPC"  # the floor's mode, at concurrency 64 only
BARE_STEP_S = 0.001
STORE = {b"ray::CheckpointStore": "store"}

Runs = dict[tuple[str, int], list[LifecycleSamples]]


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    seconds, warmup = (1.5, 0.3) if args.quick else (2.5, 0.5)
    grpc = await cluster.grpc()
    direct = DirectDriver(cluster.handles)
    inproc = InProcessDriver(build_engine(cluster.replica_config))
    bare_server = await BareServer(BARE_STEP_S).start()
    bare = await GrpcDriver.start(bare_server.address)
    ping = cluster.handles[0].ping.remote
    runs: Runs = defaultdict(list)
    replicas = [ReplicaClient(handle) for handle in cluster.handles]
    lockstep: list[float] = []  # the gateway's lifecycles/s with its clients in lockstep

    async def replica_steps() -> list[StepStats]:
        snaps = await asyncio.gather(*(replica.snapshot() for replica in replicas))
        return [snap.steps for snap in snaps]

    costs = LifecycleCosts(CpuMeter({grpc.pid: "client"}, {**ACTOR_GROUPS, **STORE}), replica_steps)
    gateway = cluster.server.gateway
    assert gateway is not None
    metered = {
        "gateway": (
            lambda: {"replica": gateway.calls.batchers, "router": [gateway.updates.batcher]},
            lambda conc: grpc.lifecycles(conc, seconds, warmup, NEW_TOKENS),
        ),
        "direct": (
            direct.batchers,
            lambda conc: direct.lifecycles(conc, seconds, warmup, NEW_TOKENS),
        ),
    }
    try:
        # every path once (channels, streams, the model), then the yardstick
        await grpc.lifecycles(1, 0.3, 0.0, NEW_TOKENS)
        await direct.lifecycles(1, 0.3, 0.0, NEW_TOKENS)
        inproc.lifecycles(1, 0.3, 0.0, NEW_TOKENS)
        await bare.lifecycles(1, 0.3, 0.0, NEW_TOKENS)
        ping_ms = await sequential_ms(ping, 200 if args.quick else 500)
        total = 1000 if args.quick else 3000
        ping_rates = {n: await calls_per_second(ping, n, total) for n in (16, 64)}
        for _ in range(args.repeats):
            for conc in CONCURRENCY:
                for mode, (batchers, work) in metered.items():
                    run = work(conc)  # a coroutine: it starts when awaited
                    runs[mode, conc].append(
                        await (costs.run(mode, batchers, run) if conc == 64 else run)
                    )
                runs["in-process", conc].append(
                    inproc.lifecycles(conc, seconds, warmup, NEW_TOKENS)
                )
            runs[BARE, 64].append(await bare.lifecycles(64, seconds, warmup, NEW_TOKENS))
            lockstep.append(await grpc.lockstep_rounds(64, seconds, NEW_TOKENS))
    finally:
        direct.stop()
        bare.stop()
        await bare_server.stop()
    print_lifecycles(runs)
    print_ratios(runs)
    print_yardstick(runs, ping_ms, ping_rates)
    costs.print(
        "where a lifecycle's cost goes at concurrency 64: every process shares the cores, so "
        "lifecycles/s is\nabout 2 cores / total CPU per lifecycle; smaller batches cost the "
        "replica more calls, steps and stream items"
    )
    gateway, direct_rates, bare_rates = (rates(runs, m, 64) for m in ("gateway", "direct", BARE))
    ceiling = [b / (b + d) for b, d in zip(bare_rates, direct_rates)]
    print(
        f"\nfloor: a bare grpc.aio server of the same service, the same client, concurrency 64: "
        f"{Spread.of(bare_rates).format('.1f')} lifecycles/s; gateway / direct can be at most "
        f"bare / (bare + direct) = {Spread.of(ceiling).format('.2f')}"
    )
    print(
        f"the gateway with its {CONCURRENCY[-1]} clients in lockstep (rounds of lifecycles "
        "started together, as the direct driver's workers run): "
        f"{Spread.of(lockstep).format('.1f')} lifecycles/s, "
        f"{ratios(lockstep, direct_rates).format()} of direct's"
    )
    return [
        Goal(
            "gateway / direct lifecycles/s at concurrency 64",
            ratios(gateway, direct_rates),
            GOAL_GATEWAY_VS_DIRECT,
        ),
        Goal("floor: bare / (bare + direct) at 64", Spread.of(ceiling), GOAL_GATEWAY_VS_DIRECT),
        Goal(
            "gateway, clients in lockstep / direct at 64",
            ratios(lockstep, direct_rates),
            GOAL_GATEWAY_VS_DIRECT,
        ),
    ]


def rates(runs: Runs, mode: str, conc: int) -> list[float]:
    return [samples.rate for samples in runs[mode, conc]]


def print_lifecycles(runs: Runs) -> None:
    print(
        f"\nsession lifecycle: open, one turn ({len(PROMPT)}-token prompt, {NEW_TOKENS} new "
        "tokens, greedy), close; closed loop"
    )
    table = Table(
        "conc",
        "mode",
        "sessions/s",
        "p50 ms",
        "p99 ms",
        "open p50",
        "turn p50",
        "close p50",
        "n",
        "notes",
    )
    for conc in CONCURRENCY:
        for mode in MODES:
            s = LifecycleSamples.merged(runs[mode, conc])
            notes = []
            if s.tokens_per_turn != {NEW_TOKENS}:
                notes.append(f"tokens/turn {sorted(s.tokens_per_turn)}")
            if s.errors:
                notes.append(f"errors {dict(s.errors)}")
            table.add(
                conc,
                mode,
                Spread.of(rates(runs, mode, conc)).format(".1f"),
                number(s.p50_ms),
                number(s.p99_ms),
                number(p50(s.open_ms)),
                number(p50(s.turn_ms)),
                number(p50(s.close_ms)),
                s.count,
                "; ".join(notes),
            )
    table.print()
    print(
        "  sessions/s: median (min–max) over repetitions; latencies pooled over them; "
        "the turn is submit -> last token"
    )


def print_ratios(runs: Runs) -> None:
    print("\nratios, each measured side by side (sessions/s; p50 latency)")
    table = Table(
        "conc",
        "gateway/direct",
        "direct/in-process",
        "gateway/in-process",
        "p50 gateway/direct",
        "p50 direct/in-process",
    )
    for conc in CONCURRENCY:
        g, d, e = (rates(runs, mode, conc) for mode in MODES)
        gp, dp, ep = (LifecycleSamples.merged(runs[m, conc]).p50_ms for m in MODES)
        table.add(
            conc,
            ratios(g, d).format(),
            ratios(d, e).format(),
            ratios(g, e).format(),
            ratio(gp, dp),
            ratio(dp, ep),
        )
    table.print()


def print_yardstick(runs: Runs, ping_ms: list[float], ping_rates: dict[int, float]) -> None:
    print("\nyardstick: raw async actor calls (ping on a replica actor, from this process)")
    print(f"  one at a time: p50 {p50(ping_ms):.2f} ms, p99 {p99(ping_ms):.2f} ms")
    for in_flight, rate in ping_rates.items():
        print(f"  {in_flight:>3} in flight: {rate:,.0f} calls/s")
    best = max(ping_rates.values())
    print(
        "  a gateway lifecycle is 5 actor calls unbatched (open, submit and close on the "
        "replica, pin and forget on the router),\n  a direct one 3, each plus >= 1 stream item "
        "per engine step; share of the actor-call ceiling reached:"
    )
    table = Table(
        "conc", *(f"{mode} ({best / n:,.0f}/s ceiling)" for mode, n in ACTOR_CALLS.items())
    )
    for conc in CONCURRENCY:
        shares = (
            Spread.of(rates(runs, mode, conc)).median * n / best for mode, n in ACTOR_CALLS.items()
        )
        table.add(conc, *(f"{share:.0%}" for share in shares))
    table.print()


if __name__ == "__main__":
    runner.main(__doc__, measure)
