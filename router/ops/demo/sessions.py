"""The demo's sessions: short multi-turn sessions, Converse streams with barge-in, and clients
that disconnect mid-stream, each through one of the cluster's gateways. A multi-turn session
takes each turn through a gateway chosen at random: any gateway continues any session.
"""

from __future__ import annotations

import asyncio
import random
import time

import grpc

from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient, generate_request

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


async def multi_turn(clients: list[AsyncSessionClient], rng: random.Random, stats: Stats) -> None:
    session = await rng.choice(clients).open(timeout=60)
    for _ in range(rng.randint(2, 3)):
        client = rng.choice(clients)  # any gateway continues the session
        await timed_turn(client, session.session_id, stats, rng.choice(PROMPTS), rng.randint(4, 12))
    await rng.choice(clients).close_session(session.session_id)


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


async def worker(
    clients: list[AsyncSessionClient], jobs: asyncio.Queue, stats: Stats, seed: int
) -> None:
    rng = random.Random(seed)
    while not jobs.empty():
        client = rng.choice(clients)
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
                await multi_turn(clients, rng, stats)
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
