"""bench.delivery's bare engine actor does the work it stands for: in its own process it runs the
same engine as the in-process driver, and its stream carries every token of every round (each
step's rows and turn ends), as many as the in-process engine delivers for the same rounds."""

from __future__ import annotations

import asyncio
import os

import ray

from bench.harness.bare_engine_actor import BareEngineActor, bare_token_rounds
from bench.harness.inprocess_driver import InProcessDriver, build_engine
from replica.config import PoolConfig, ReplicaConfig

SESSIONS, NEW_TOKENS, ROUNDS = 4, 6, 2


def test_the_bare_actor_streams_every_token_the_engine_makes(ray_cluster):
    pools = PoolConfig(max_sessions=SESSIONS, kv_tokens=SESSIONS * 128, max_context=128)
    config = ReplicaConfig(pools=pools, threads=1)
    actor = BareEngineActor.remote(config)
    try:
        bare = asyncio.run(bare_token_rounds(actor, SESSIONS, NEW_TOKENS, ROUNDS))
        again = asyncio.run(bare_token_rounds(actor, SESSIONS, NEW_TOKENS, ROUNDS))
        actor_pid = ray.get(actor.pid.remote())
    finally:
        ray.kill(actor)
    inproc = InProcessDriver(build_engine(config)).token_rounds(SESSIONS, NEW_TOKENS, ROUNDS)
    assert [n for n, _ in inproc.rounds] == [SESSIONS * NEW_TOKENS] * ROUNDS
    assert [n for n, _ in bare.rounds] == [n for n, _ in inproc.rounds]
    # a second run opens as many again: the first one's sessions were all closed
    assert [n for n, _ in again.rounds] == [n for n, _ in inproc.rounds]
    assert actor_pid != os.getpid()  # a process of its own, as a replica
