"""Token delivery and scale-out (issue 13), each figure a ratio measured side by side in one run:

1. gateway CPU per delivered token / a bare grpc.aio server's CPU per message of the same shape
   (64 streams; the bare server, in this process like the gateway, streams one-token chunks at
   the engine's step rate measured just before: ``bench.harness.bare_server``). Goal <= 1.5.
   With it, the floor of streaming from an actor: the CPU per token of a bare relay of a Ray
   stream of the same items at the same rate to the same gRPC streams
   (``bench.harness.relay_server``), and the gateway against it.
2. tokens per message for a client that reads a message every 0, 10 and 30 ms (one stream, so
   that the engine produces several tokens per 10 ms for it even on a busy 2-core box): what
   the engine produces while a client has not taken the last message is merged into the next
   one, so messages grow with the backlog. Goal: more than 1 at 10 ms, and growing with it.
3. direct-actor tokens/s / the in-process engine's, at 8 and 64 sessions (64 tokens a turn).
   Goal >= 0.8. With it (``bench.harness.actor_floor``), the same rounds on the replica read over
   its Ray stream instead of its output socket, on a replica outside the cluster with its own
   checkpoint store, on one without session checkpoints, and on a bare engine actor streaming an
   item a step over Ray; each path's CPU per token.
4. gRPC lifecycles/s / direct-actor lifecycles/s at concurrency 64 (open, a turn of 8 tokens,
   close). Goal >= 0.8.
5. two gateways vs one: tokens/s to 128 streams from two client processes (64 each), both on
   serve's gateway, or one on it and one on a ``session-router gateway`` process. Goal >= 1.6 on
   a machine with the cores for it (both gateways, the replica, the clients and Ray each need
   one); on a 2-core box it shows what sharing two cores costs.

Clients run in child processes (``ClientProcess``) with ``router.client``'s channel options.
Every repetition runs each path once, interleaved. Run: ``python -m bench.delivery [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections import defaultdict

import ray

from bench.harness import runner
from bench.harness.actor_floor import ActorFloor
from bench.harness.bare_engine_actor import BareEngineActor
from bench.harness.bare_server import BareServer
from bench.harness.client_process import ClientProcess
from bench.harness.cluster import LocalCluster
from bench.harness.cpu import CpuMeter
from bench.harness.direct_driver import DirectDriver
from bench.harness.gateway_process import GatewayProcess
from bench.harness.inprocess_driver import InProcessDriver, build_engine
from bench.harness.relay_server import RelayServer
from bench.harness.report import Goal, Table
from bench.harness.stats import Spread, ratios
from bench.harness.streams import StreamRounds, run_stream_rounds
from replica.actor import CheckpointStore, remote_replica_actor

STREAMS = 64
READ_EVERY_MS = (0, 10, 30)
SLOW_STREAMS = 1
ACTOR_SESSIONS = (8, 64)
LIFECYCLE_CONCURRENCY = 64
GOAL_CPU = 1.5
GOAL_ACTOR = 0.8
GOAL_LIFECYCLES = 0.8
GOAL_TWO_GATEWAYS = 1.6


async def streams(client: ClientProcess, sessions: int, tokens: int, read_ms: int = 0):
    return await client.call(
        run_stream_rounds,
        sessions=sessions,
        new_tokens=tokens,
        rounds=1,
        read_every_s=read_ms / 1000,
    )


async def measure(cluster: LocalCluster, args: argparse.Namespace) -> list[Goal]:
    tokens = 120 if args.quick else 240  # two turns fit the benchmark's 512-token context
    grpc_driver = await cluster.grpc()
    client = grpc_driver.client
    cpu = CpuMeter({client.pid: "client"})
    direct = DirectDriver(cluster.handles[:1])
    standalone, store = await standalone_replica(cluster, "bench-standalone", True)
    unchecked_replica, _ = await standalone_replica(cluster, "bench-no-checkpoints", False)
    drivers = {
        "actor": direct,
        "over Ray": DirectDriver(cluster.handles[:1], use_socket=False),
        "standalone": DirectDriver([standalone]),
        "no checkpoints": DirectDriver([unchecked_replica]),
    }
    for path in ("standalone", "no checkpoints"):  # warm them, as section 1 warms the first
        await drivers[path].token_rounds(max(ACTOR_SESSIONS), 8, 1)
    inproc = InProcessDriver(build_engine(cluster.replica_config))
    second = GatewayProcess(cluster.config.namespace).start()
    clients = [await ClientProcess.start(cluster.server.grpc_address) for _ in range(2)]
    client_b = await ClientProcess.start(second.address)
    figures: dict[str, list[float]] = defaultdict(list)
    bare = BareEngineActor.remote(cluster.replica_config)
    floor = ActorFloor(drivers, inproc, bare, cpu, ACTOR_SESSIONS)
    try:
        for _ in range(args.repeats):
            await cpu_per_token(cluster, client, cpu, tokens, figures)
            for ms in READ_EVERY_MS:
                run = await streams(client, SLOW_STREAMS, tokens, ms)
                figures[f"tokens/message {ms} ms"].append(run.tokens_per_message)
            for n in ACTOR_SESSIONS:
                await floor.rounds(n)
            conc = LIFECYCLE_CONCURRENCY
            figures["lifecycles gRPC"].append(
                (await grpc_driver.lifecycles(conc, 2.5, 0.5, 8)).rate
            )
            figures["lifecycles direct"].append((await direct.lifecycles(conc, 2.5, 0.5, 8)).rate)
            for name, pair in (("one", clients), ("two", [clients[0], client_b])):
                runs = await asyncio.gather(*(streams(c, STREAMS, tokens // 2) for c in pair))
                figures[f"{name} gateway(s)"].append(sum(r.rate for r in runs))
    finally:
        ray.kill(bare)
        for driver in drivers.values():
            driver.stop()
        for actor in (standalone, store, unchecked_replica):
            ray.kill(actor)
        for c in (*clients, client_b):
            c.stop()
        second.stop()
    return report(figures, floor)


async def standalone_replica(
    cluster: LocalCluster, name: str, checkpoints: bool
) -> tuple[ray.actor.ActorHandle, ray.actor.ActorHandle | None]:
    """A replica outside the cluster (no router, gateway or controller) with the cluster's
    settings, and with ``checkpoints`` the checkpoint store that follows it."""
    config = dataclasses.replace(cluster.replica_config, session_checkpoints=checkpoints)
    options = {"num_cpus": 0, "max_concurrency": 10_000}
    replica = remote_replica_actor().options(**options).remote(name, config)
    if not checkpoints:
        return replica, None
    node = (await replica.describe.remote()).node_id
    store = ray.remote(CheckpointStore).options(num_cpus=0).remote(name)
    await store.follow.remote(replica, node)
    return replica, store


async def cpu_per_token(
    cluster: LocalCluster,
    client: ClientProcess,
    cpu: CpuMeter,
    tokens: int,
    figures: dict[str, list[float]],
) -> None:
    """The gateway's CPU per delivered token, then the bare server's per message and the bare
    relay's per token at the same step rate, all three in this process."""
    async with cluster.on_first_replica():
        before = cpu.sample()
        run: StreamRounds = await streams(client, STREAMS, tokens)
        used = CpuMeter.delta(before, cpu.sample())
    figures["gateway CPU us/token"].append(used["gateway"] / run.tokens * 1e6)
    figures["gateway tokens/message"].append(run.tokens_per_message)
    bare_run, bare_cpu = await floor_run(await BareServer(step_s=run.step_s).start(), cpu, tokens)
    figures["bare CPU us/message"].append(bare_cpu / bare_run.messages * 1e6)
    relay = await RelayServer(step_s=run.step_s, streams=STREAMS).start()
    relay_run, relay_cpu = await floor_run(relay, cpu, tokens)
    figures["relay CPU us/token"].append(relay_cpu / relay_run.tokens * 1e6)
    figures["relay tokens/message"].append(relay_run.tokens_per_message)


async def floor_run(
    server: BareServer | RelayServer, cpu: CpuMeter, tokens: int
) -> tuple[StreamRounds, float]:
    """``STREAMS`` streams on the started ``server`` from a client process of their own, then
    the server is stopped: the run, and this process's CPU seconds over it."""
    client = await ClientProcess.start(server.address)
    try:
        before = cpu.sample()
        run: StreamRounds = await streams(client, STREAMS, tokens)
        return run, CpuMeter.delta(before, cpu.sample())["gateway"]
    finally:
        client.stop()
        await server.stop()


def report(figures: dict[str, list[float]], floor: ActorFloor) -> list[Goal]:
    f = figures
    print("\n1. CPU of this process per delivered token (gateway) and per message (bare grpc.aio)")
    table = Table("server", "CPU us", "tokens/message")
    table.add(
        "gateway",
        Spread.of(f["gateway CPU us/token"]).format(".1f"),
        Spread.of(f["gateway tokens/message"]).format(),
    )
    table.add("bare grpc.aio", Spread.of(f["bare CPU us/message"]).format(".1f"), "1.00")
    table.add(
        "bare relay of a Ray stream",
        Spread.of(f["relay CPU us/token"]).format(".1f"),
        Spread.of(f["relay tokens/message"]).format(),
    )
    table.print()
    relay = ratios(f["gateway CPU us/token"], f["relay CPU us/token"])
    print(f"gateway / bare relay: {relay.format()}")
    print(f"\n2. tokens per message, {SLOW_STREAMS} stream(s), the client reading one every N ms")
    table = Table("read every", "tokens/message")
    for ms in READ_EVERY_MS:
        table.add(f"{ms} ms", Spread.of(f[f"tokens/message {ms} ms"]).format())
    table.print()
    floor.print()
    print(f"\n4. lifecycles/s at concurrency {LIFECYCLE_CONCURRENCY}")
    table = Table("path", "lifecycles/s")
    table.add("gRPC", Spread.of(f["lifecycles gRPC"]).format(".1f"))
    table.add("direct actor", Spread.of(f["lifecycles direct"]).format(".1f"))
    table.print()
    print(f"\n5. tokens/s to {2 * STREAMS} streams from two client processes")
    table = Table("gateways", "tokens/s")
    table.add("one", Spread.of(f["one gateway(s)"]).format(",.0f"))
    table.add("two", Spread.of(f["two gateway(s)"]).format(",.0f"))
    table.print()
    slow = f"tokens/message {READ_EVERY_MS[1]} ms"
    return [
        Goal(
            "gateway CPU per token / bare gRPC per message (a bare relay of a Ray stream "
            f"allows {ratios(f['relay CPU us/token'], f['bare CPU us/message']).median:.2f})",
            ratios(f["gateway CPU us/token"], f["bare CPU us/message"]),
            GOAL_CPU,
            False,
        ),
        Goal(
            f"tokens per message, client reading every {READ_EVERY_MS[1]} ms",
            Spread.of(f[slow]),
            1.0,
            True,
        ),
        *(
            Goal(
                f"direct actor / in-process tokens/s, {n} sessions (over Ray "
                f"{floor.ratio('over Ray', n).median:.2f}, a replica outside the cluster "
                f"{floor.ratio('standalone', n).median:.2f}, without checkpoints "
                f"{floor.ratio('no checkpoints', n).median:.2f}, a bare engine actor over Ray "
                f"{floor.ratio('bare actor', n).median:.2f})",
                floor.ratio("actor", n),
                GOAL_ACTOR,
            )
            for n in ACTOR_SESSIONS
        ),
        Goal(
            f"gRPC / direct lifecycles/s at concurrency {LIFECYCLE_CONCURRENCY}",
            ratios(f["lifecycles gRPC"], f["lifecycles direct"]),
            GOAL_LIFECYCLES,
        ),
        Goal(
            "two gateways / one, tokens/s to 128 streams",
            ratios(f["two gateway(s)"], f["one gateway(s)"]),
            GOAL_TWO_GATEWAYS,
        ),
    ]


if __name__ == "__main__":
    runner.main(__doc__, measure)
