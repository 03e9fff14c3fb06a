"""bench.delivery's relay floor does the work it stands for: every stream's tokens come from the
producer actor's items (each session's own row), over real gRPC, ending with the finish reason;
and stopping it ends the producer."""

from __future__ import annotations

import asyncio

import pytest
import ray

from bench.harness.relay_server import RelayServer
from protos import session_router_pb2 as pb
from router.client import AsyncSessionClient

STREAMS = 4
TOKENS = 20
PROMPT = [5, 6, 7]


async def relay_turns() -> tuple[list[list[int]], list[pb.GenerateChunk], ray.actor.ActorHandle]:
    relay = await RelayServer(step_s=0.005, streams=STREAMS).start()
    client = AsyncSessionClient(relay.address)
    try:
        sessions = [await client.open() for _ in range(STREAMS)]

        async def turn(session_id: str) -> tuple[list[int], pb.GenerateChunk]:
            ids, last = [], None
            async for chunk in client.generate(session_id, tokens=PROMPT, max_new_tokens=TOKENS):
                ids.extend(chunk.token_ids)
                last = chunk
            return ids, last

        turns = await asyncio.gather(*(turn(s.session_id) for s in sessions))
    finally:
        await client.close()
        await relay.stop()
    return [ids for ids, _ in turns], [last for _, last in turns], relay.producer


def test_each_stream_gets_its_rows_tokens_and_the_producer_ends(ray_cluster):
    tokens, lasts, producer = asyncio.run(relay_turns())
    # RowsItem gives session s the token s at every step: each stream saw only its own row
    assert tokens == [[s] * TOKENS for s in range(STREAMS)]
    assert all(last.finish_reason == pb.FINISH_REASON_LENGTH for last in lasts)
    assert all(last.committed_tokens == len(PROMPT) + TOKENS for last in lasts)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(producer.stream.remote(1, 0.01).__next__(), timeout=30)
