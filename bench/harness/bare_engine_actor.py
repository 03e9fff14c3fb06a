"""A bare engine actor: the replica's engine in a Ray actor that streams one item per engine step
to its caller and does nothing else, the floor of ``bench.delivery``'s direct actor ÷ in-process.

``BareEngineActor`` builds the engine as ``InProcessDriver``'s (``build_engine``, the same config)
in a process of its own, as a replica is. A round is one streaming call: it submits a turn on
each session and steps the engine on the actor's own thread until they end, yielding each step's
token rows and turn events as one item (the shape a replica sends a gateway). None of the replica
actor's code runs: no engine thread beside an event loop, no batched calls, no per-gateway
output streams, no checkpoints, no snapshots. So bare actor ÷ in-process is what an actor that
streams an engine's steps reaches at all, measured rather than computed.
"""

from __future__ import annotations

import os
import time

import ray

from bench.harness.inprocess_driver import InProcessDriver, build_engine
from bench.harness.workload import TokenRounds
from replica.config import ReplicaConfig


@ray.remote(num_cpus=0)
class BareEngineActor:
    def __init__(self, config: ReplicaConfig) -> None:
        self.engine = build_engine(config)
        self.driver = InProcessDriver(self.engine)  # its opens and submissions, as in-process
        self.session_ids: list[str] = []

    def pid(self) -> int:
        return os.getpid()

    def open(self, sessions: int) -> None:
        self.session_ids = [self.driver.open() for _ in range(sessions)]

    def round(self, new_tokens: int):
        """A turn on every open session, stepped to the end: an item per step."""
        for session_id in self.session_ids:
            self.driver.submit(session_id, new_tokens)
        while self.engine.has_work:
            out = self.engine.step()
            yield [(out.session_ids, out.turn_ids, out.token_ids, out.texts), *out.events]

    def close(self) -> None:
        for session_id in self.session_ids:
            self.engine.close_session(session_id)
        self.session_ids = []


async def bare_token_rounds(
    actor: ray.actor.ActorHandle, sessions: int, new_tokens: int, rounds: int
) -> TokenRounds:
    """``InProcessDriver.token_rounds`` on ``actor``, each item read as a gateway reads it."""
    await actor.open.remote(sessions)
    result = TokenRounds()
    try:
        for _ in range(rounds):
            t0, tokens = time.perf_counter(), 0
            async for ref in actor.round.remote(new_tokens):
                rows, *events = ray.get(ref)
                tokens += len(rows[2]) + sum(len(event.token_ids) for event in events)
            result.rounds.append((tokens, time.perf_counter() - t0))
    finally:
        await actor.close.remote()
    return result
