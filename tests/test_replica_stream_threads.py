"""A replica streams each gateway's outputs on a thread of its own while one is free, and from its
event loop when none is: with one thread, the first gateway's stream takes it and the second
streams from the loop, and both get their turns' tokens, the same for the same turn. A newer
stream of a gateway ends its older one, whose thread is then free for the next gateway."""

from __future__ import annotations

import asyncio

import ray

from replica.actor import remote_replica_actor
from replica.actor.client import ReplicaClient
from replica.api import SamplingParams, TurnEvent
from replica.config import PoolConfig, ReplicaConfig

NEW_TOKENS = 6


async def one_turn(client: ReplicaClient, stream, gateway_id: str) -> list[int]:
    """Open a session for ``gateway_id``, run a turn, read its tokens from ``stream``."""
    session_id = f"{gateway_id}-session"
    opened = await client.open_session(session_id=session_id, gateway_id=gateway_id)
    assert not hasattr(opened, "code"), opened
    turn = await client.submit_turn(
        gateway_id=gateway_id,
        session_id=session_id,
        text=None,
        token_ids=[5, 6, 7],
        sampling=SamplingParams(max_new_tokens=NEW_TOKENS),
    )
    assert isinstance(turn, int), turn
    tokens: list[int] = []
    async for ref in stream:
        for entry in ray.get(ref):
            if type(entry) is tuple:  # token rows
                tokens += [t for sid, t in zip(entry[0], entry[2]) if sid == session_id]
            elif isinstance(entry, TurnEvent) and entry.session_id == session_id:
                tokens += entry.token_ids
                if entry.finished:
                    await client.close_sessions(session_ids=[session_id])
                    return tokens
    raise AssertionError("the stream ended before the turn")


def test_a_thread_reserved_but_never_streamed_on_stays_held_and_streams_use_the_loop(ray_cluster):
    config = ReplicaConfig(pools=PoolConfig(max_sessions=4, kv_tokens=512), threads=1)
    handle = remote_replica_actor(1).options(num_cpus=0).remote("threads", config, None, 1.0, 1)
    client = ReplicaClient(handle)

    async def run() -> None:
        assert await handle.output_stream_group.remote("probe") == "outputs-0"
        streams = {g: await client.stream_outputs(gateway_id=g) for g in ("gw-a", "gw-b")}
        # the probe holds the one thread (it never streamed): both stream from the loop
        a, b = await asyncio.gather(*(one_turn(client, s, g) for g, s in streams.items()))
        assert a == b and len(a) == NEW_TOKENS
        assert await handle.output_stream_group.remote("gw-c") == ""  # still held

    asyncio.run(run())
    ray.kill(handle)


def test_a_stream_on_the_thread_and_one_on_the_loop_both_deliver(ray_cluster):
    config = ReplicaConfig(pools=PoolConfig(max_sessions=4, kv_tokens=512), threads=1)
    handle = remote_replica_actor(1).options(num_cpus=0).remote("threads2", config, None, 1.0, 1)
    client = ReplicaClient(handle)

    async def run() -> None:
        on_thread = await client.stream_outputs(gateway_id="gw-a")  # takes the one thread
        on_loop = await client.stream_outputs(gateway_id="gw-b")
        a, b = await asyncio.gather(
            one_turn(client, on_thread, "gw-a"), one_turn(client, on_loop, "gw-b")
        )
        assert a == b and len(a) == NEW_TOKENS
        assert await handle.output_stream_group.remote("gw-c") == ""  # gw-a streams on it
        again = await client.stream_outputs(gateway_id="gw-a")  # from the loop: none is free
        assert [ray.get(ref) async for ref in on_thread] in ([], [[]])  # the older one ends
        assert await handle.output_stream_group.remote("gw-c") == "outputs-0"  # given back
        assert len(await one_turn(client, again, "gw-a")) == NEW_TOKENS

    asyncio.run(run())
    ray.kill(handle)
