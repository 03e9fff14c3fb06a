"""The session workloads through the gateway: ``AsyncSessionClient`` over loopback gRPC, in a
child process (``ClientProcess``), -> gateway -> router actor (open, close) -> replica actor.

The module-level ``run_*`` functions run in the child; ``GrpcDriver`` sends them there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.harness.client_process import ClientProcess
from bench.harness.load import closed_loop
from bench.harness.profile import GatewayProfile
from bench.harness.window import LifecycleSamples
from bench.harness.workload import PROMPT, Lifecycle, TokenRounds
from router.client import AsyncSessionClient


@dataclass
class RpcLatencies:
    """Sequential unary calls through the gateway, in ms: ``GetSession`` (client -> gateway ->
    replica actor) and a ``grpc.health`` Check (the gRPC round trip alone, no actor call),
    interleaved so both see the same conditions."""

    get_session_ms: list[float]
    health_ms: list[float]


async def _turn(client: AsyncSessionClient, session_id: str, new_tokens: int) -> int:
    tokens = 0
    async for chunk in client.generate(session_id, tokens=PROMPT, max_new_tokens=new_tokens):
        tokens += len(chunk.token_ids)
    return tokens


async def _lifecycle(client: AsyncSessionClient, new_tokens: int) -> Lifecycle:
    t0 = time.perf_counter()
    session = await client.open()
    t1 = time.perf_counter()
    try:
        tokens = await _turn(client, session.session_id, new_tokens)
    finally:
        t2 = time.perf_counter()
        await client.close_session(session.session_id)
    return Lifecycle(t0, t1, t2, time.perf_counter(), tokens)


async def run_lifecycles(
    client: AsyncSessionClient, concurrency: int, seconds: float, warmup: float, new_tokens: int
) -> LifecycleSamples:
    return await closed_loop(lambda: _lifecycle(client, new_tokens), concurrency, seconds, warmup)


async def run_lockstep_rounds(
    client: AsyncSessionClient, concurrency: int, seconds: float, new_tokens: int
) -> float:
    """Rounds of ``concurrency`` lifecycles started together, the next once the last has ended
    (the direct driver's workers fall into this by themselves: their calls batch together and
    their turns end in one step): lifecycles/s over ``seconds`` of rounds, after one round that
    warms up."""
    await asyncio.gather(*(_lifecycle(client, new_tokens) for _ in range(concurrency)))
    t0, done = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        await asyncio.gather(*(_lifecycle(client, new_tokens) for _ in range(concurrency)))
        done += concurrency
    return done / (time.perf_counter() - t0)


async def run_token_rounds(
    client: AsyncSessionClient, sessions: int, new_tokens: int, rounds: int
) -> TokenRounds:
    opened = await asyncio.gather(*(client.open() for _ in range(sessions)))
    result = TokenRounds(replicas=sorted({s.replica_id for s in opened}))
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            counts = await asyncio.gather(
                *(_turn(client, s.session_id, new_tokens) for s in opened)
            )
            result.rounds.append((sum(counts), time.perf_counter() - t0))
    finally:
        await asyncio.gather(*(client.close_session(s.session_id) for s in opened))
    return result


async def run_rpc_latencies(
    client: AsyncSessionClient, session_id: str, count: int
) -> RpcLatencies:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from protos import session_router_pb2 as pb

    health = health_pb2_grpc.HealthStub(client.channel)
    get_request = pb.GetSessionRequest(session_id=session_id)
    health_request = health_pb2.HealthCheckRequest(service="")
    result = RpcLatencies([], [])
    for i in range(count + count // 10):  # the first tenth warms up
        t0 = time.perf_counter()
        await client.sessions.GetSession(get_request, metadata=client.metadata)
        t1 = time.perf_counter()
        await health.Check(health_request)
        t2 = time.perf_counter()
        if i >= count // 10:
            result.get_session_ms.append((t1 - t0) * 1e3)
            result.health_ms.append((t2 - t1) * 1e3)
    return result


async def run_open(client: AsyncSessionClient) -> tuple[str, str]:
    session = await client.open()
    return session.session_id, session.replica_id


async def run_close(client: AsyncSessionClient, session_id: str) -> bool:
    return await client.close_session(session_id)


class GrpcDriver:
    """The workloads through the gateway, from ``client`` (a started ``ClientProcess`` of the
    gateway's address); ``profile`` covers this process (the gateway) while each call runs."""

    def __init__(self, client: ClientProcess, profile: GatewayProfile | None = None) -> None:
        self.client = client
        self.profile = profile or GatewayProfile(None)

    @classmethod
    async def start(cls, address: str, profile: GatewayProfile | None = None) -> GrpcDriver:
        return cls(await ClientProcess.start(address), profile)

    @property
    def pid(self) -> int:
        return self.client.pid

    async def _profiled(self, run: Callable[..., Awaitable[Any]], **kwargs: Any) -> Any:
        """``run(client, **kwargs)`` in the client process, this process (the gateway) profiled
        meanwhile."""
        with self.profile.during():
            return await self.client.call(run, **kwargs)

    async def lifecycles(
        self, concurrency: int, seconds: float, warmup: float, new_tokens: int
    ) -> LifecycleSamples:
        """A closed loop of lifecycles (``closed_loop``) in the client process."""
        return await self._profiled(
            run_lifecycles,
            concurrency=concurrency,
            seconds=seconds,
            warmup=warmup,
            new_tokens=new_tokens,
        )

    async def lockstep_rounds(self, concurrency: int, seconds: float, new_tokens: int) -> float:
        """``run_lockstep_rounds`` in the client process: lifecycles/s."""
        return await self._profiled(
            run_lockstep_rounds, concurrency=concurrency, seconds=seconds, new_tokens=new_tokens
        )

    async def token_rounds(self, sessions: int, new_tokens: int, rounds: int) -> TokenRounds:
        """``sessions`` sessions opened through the router, ``rounds`` turns on all at once."""
        return await self._profiled(
            run_token_rounds, sessions=sessions, new_tokens=new_tokens, rounds=rounds
        )

    async def rpc_latencies(self, session_id: str, count: int) -> RpcLatencies:
        """``count`` GetSession calls on ``session_id`` and as many health checks, alternating,
        after a tenth more of each that warm up."""
        return await self._profiled(run_rpc_latencies, session_id=session_id, count=count)

    async def open_session(self) -> tuple[str, str]:
        """Opens a session through the gateway: its id and the replica it is on."""
        return await self.client.call(run_open)

    async def close_session(self, session_id: str) -> bool:
        return await self.client.call(run_close, session_id=session_id)

    def stop(self) -> None:
        self.client.stop()

    def __enter__(self) -> GrpcDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
