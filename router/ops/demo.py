"""``session-router demo``: a local cluster serving a few hundred short sessions.

Starts an embedded Ray with 2 replicas, runs short sessions from 16 concurrent clients
(multi-turn Generate, Converse with barge-in, a few clients that disconnect mid-stream), then
keeps more sessions open at once than the replicas have GPU slots, so idle ones are parked in host
memory and restored for their turns (``router.ops.demo_parking``). Prints a per-replica table of
the GPU and host pools before, during and after, the sessions/s, the time to first token and the
parks and restores, and exits 0 only when every pool is back at capacity with nothing leaked.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import grpc

from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient, generate_request
from router.config import ServeConfig
from router.flags import add_arguments as add_serve_arguments
from router.flags import from_arguments
from router.ops.demo_parking import run_parking_phase
from router.ops.pool_table import render, rows_from_replicas
from router.ops.serve import Server

PROMPTS = [
    "Hello!",
    "What's the weather like?",
    "Tell me a story.",
    "ok",
    "And then?",
    "Translate this please",
    "How are you today?",
    "Summarise our chat.",
]


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
    host="127.0.0.1",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, default=300, help="sessions to run")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--seed", type=int, default=0)
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


class Stats:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.done = 0
        self.kinds: dict[str, int] = {}


async def timed_turn(
    client: AsyncSessionClient, sid: str, stats: Stats, text: str, max_new_tokens: int
) -> None:
    start, first = time.perf_counter(), True
    async for chunk in client.generate(sid, text=text, max_new_tokens=max_new_tokens):
        if first and chunk.token_ids:
            stats.ttft.append(time.perf_counter() - start)
            first = False


async def multi_turn(client: AsyncSessionClient, rng: random.Random, stats: Stats) -> None:
    session = await client.open(timeout=60)
    for _ in range(rng.randint(2, 3)):
        await timed_turn(client, session.session_id, stats, rng.choice(PROMPTS), rng.randint(4, 12))
    await client.close_session(session.session_id)


async def disconnect_mid_stream(
    client: AsyncSessionClient, rng: random.Random, stats: Stats
) -> None:
    session = await client.open(timeout=60)
    call = client.generate(session.session_id, text=rng.choice(PROMPTS), max_new_tokens=64)
    async for _chunk in call:
        call.cancel()  # the client goes away; the turn is rolled back on the replica
        break
    await client.close_session(session.session_id)


async def converse(
    client: AsyncSessionClient, rng: random.Random, stats: Stats, hang_up: bool
) -> None:
    """Two inputs, the second barging in on the first turn's generation; then half-close."""
    inputs: asyncio.Queue = asyncio.Queue()

    async def requests():
        yield pb.ConverseRequest(open=pb.OpenSessionRequest())
        while (item := await inputs.get()) is not None:
            yield item

    call = client.converse(requests())
    turns = 0
    start = time.perf_counter()
    async for response in call:
        if response.HasField("opened"):
            inputs.put_nowait(
                pb.ConverseRequest(
                    input=generate_request(text=rng.choice(PROMPTS), max_new_tokens=48)
                )
            )
            start = time.perf_counter()
            continue
        chunk = response.chunk
        if chunk.token_ids and turns == 0:
            stats.ttft.append(time.perf_counter() - start)
            turns = 1
            if hang_up:
                call.cancel()  # disconnect mid-stream: the session is released
                return
            inputs.put_nowait(
                pb.ConverseRequest(
                    input=generate_request(  # barge-in
                        text=rng.choice(PROMPTS), max_new_tokens=6
                    )
                )
            )
        if chunk.finish_reason not in (pb.FINISH_REASON_UNSPECIFIED, pb.FINISH_REASON_INTERRUPTED):
            inputs.put_nowait(None)  # half-close after the second turn ends


async def worker(client: AsyncSessionClient, jobs: asyncio.Queue, stats: Stats, seed: int) -> None:
    rng = random.Random(seed)
    while not jobs.empty():
        index = jobs.get_nowait()
        kind = (
            "multi_turn",
            "multi_turn",
            "multi_turn",
            "multi_turn",
            "multi_turn",
            "converse",
            "converse",
            "converse",
            "disconnect",
            "converse_hang_up",
        )[index % 10]
        try:
            if kind == "multi_turn":
                await multi_turn(client, rng, stats)
            elif kind == "disconnect":
                await disconnect_mid_stream(client, rng, stats)
            else:
                await converse(client, rng, stats, hang_up=kind == "converse_hang_up")
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            if not (
                isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.CANCELLED
            ):
                raise
        stats.done += 1
        stats.kinds[kind] = stats.kinds.get(kind, 0) + 1


async def wait_back_at_capacity(client: AsyncSessionClient, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while True:
        replicas = await client.replicas()
        full = all(p.free == p.capacity for r in replicas for p in r.pools)
        if full or time.monotonic() > deadline:
            return replicas
        await asyncio.sleep(0.5)


async def run_demo(args: argparse.Namespace) -> int:
    config = from_arguments(ServeConfig, args, DEMO_DEFAULTS)
    pools = config.replica.pools
    print(
        f"demo: starting a local cluster of {config.replicas} replicas ({config.replica.model}, "
        f"{pools.max_sessions} sessions each, {pools.mamba_track_buffers} track buffers)...",
        flush=True,
    )
    server = Server(config)
    await server.start()
    client = AsyncSessionClient(server.grpc_address)
    try:
        print(f"demo: gRPC on {server.grpc_address}, metrics on {server.metrics_url}\n")
        print("before:\n" + pool_table(await wait_back_at_capacity(client, 5)) + "\n", flush=True)
        stats, jobs = Stats(), asyncio.Queue()
        for i in range(args.sessions):
            jobs.put_nowait(i)
        started = time.perf_counter()
        workers = [
            asyncio.create_task(worker(client, jobs, stats, args.seed + i))
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
        at_capacity = all(p.free == p.capacity for r in after for p in r.pools)
        ok = at_capacity and leaked == 0 and stats.done == args.sessions
        ok = ok and (parking is None or parking.turns == args.parked_sessions)
        print(
            "result: "
            + (
                "OK - every pool is back at capacity, 0 slots leaked"
                if ok
                else f"FAILED - at capacity: {at_capacity}, leaked: {leaked}"
            )
        )
        return 0 if ok else 1
    finally:
        await client.close()
        await server.stop()
