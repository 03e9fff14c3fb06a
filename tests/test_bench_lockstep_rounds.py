"""``bench.lifecycles``' gateway in lockstep: ``run_lockstep_rounds`` starts each round's
lifecycles together and the next round once the last has ended, over real gRPC (a bare server
of the service on a 20 ms step clock whose turns start after a random wait, so that clients left
to themselves would drift apart; it records when each session was opened)."""

from __future__ import annotations

import asyncio
import random
import time

import grpc

from bench.harness.bare_server import BareSessions, StepClock
from bench.harness.grpc_driver import run_lockstep_rounds
from protos import session_router_pb2_grpc as pb_grpc
from router.client import AsyncSessionClient

CLIENTS = 4
TOKENS = 8
STEP_S = 0.02  # a turn of TOKENS takes at least TOKENS steps


class OpenTimes(BareSessions):
    def __init__(self, clock: StepClock) -> None:
        super().__init__(clock)
        self.opened: list[float] = []

    async def OpenSession(self, request, context):
        self.opened.append(time.perf_counter())
        return await super().OpenSession(request, context)

    async def Generate(self, request, context):
        await asyncio.sleep(random.uniform(0, 3 * STEP_S))  # turns end at different steps
        async for chunk in super().Generate(request, context):
            yield chunk


async def test_rounds_start_together_and_follow_one_another() -> None:
    clock = StepClock(STEP_S)
    sessions = OpenTimes(clock)
    server = grpc.aio.server()
    pb_grpc.add_SessionServiceServicer_to_server(sessions, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = AsyncSessionClient(f"127.0.0.1:{port}")
    try:
        rate = await run_lockstep_rounds(client, CLIENTS, 0.6, TOKENS)
        ended = time.perf_counter()
    finally:
        await client.close()
        clock.stop()
        await server.stop(None)
    opened = sorted(sessions.opened)
    assert len(opened) % CLIENTS == 0 and len(opened) >= 3 * CLIENTS  # whole rounds
    rounds = [opened[i : i + CLIENTS] for i in range(0, len(opened), CLIENTS)]
    for this, following in zip(rounds, rounds[1:]):
        assert this[-1] - this[0] < TOKENS * STEP_S / 2  # opened together
        assert following[0] - this[-1] >= TOKENS * STEP_S  # after this round's turns ended
    # the rate counts the rounds after the first (warm-up) over their time
    assert rate <= CLIENTS / (TOKENS * STEP_S)
    measured = (len(opened) - CLIENTS) / (ended - rounds[1][0])
    assert abs(rate - measured) / measured < 0.25, (rate, measured)
