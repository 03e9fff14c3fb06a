"""The peer: the same engine behind Ray Serve (``ray[serve]``), as one would build it there.

A deployment holds an ``Engine`` on its own thread (``AsyncEngine``, as a replica does) and a
queue per session; ``generate`` is a streaming method (one item per engine step of the session).
Requests carry the session id, and Serve's ``ConsistentHashRouter`` sends every request of a
session to the replica that holds it (session affinity). ``ServeDriver`` runs the benchmark
workloads through a ``DeploymentHandle`` from this process: Serve's router runs in the caller,
as our gateway does.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from bench.harness.load import closed_loop
from bench.harness.window import LifecycleSamples
from bench.harness.workload import PROMPT, Lifecycle, TokenRounds, timed_lifecycle, token_rounds
from replica.api import SamplingParams
from replica.config import ReplicaConfig

APP = "session-router-peer"
CONSISTENT_HASH = "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"


class EnginePeer:
    """The deployment: one engine, sessions by id, a stream per turn."""

    def __init__(self, config: ReplicaConfig) -> None:
        from bench.harness.inprocess_driver import build_engine

        self.engine = build_engine(config)
        self.queues: dict[str, asyncio.Queue] = {}
        self._async = None

    async def _engine(self):
        if self._async is None:
            from replica.engine.async_engine import AsyncEngine

            self._async = AsyncEngine(self.engine, self._dispatch)
        return self._async

    def _dispatch(self, outputs: list) -> None:
        for record in outputs:  # a ``StepOutputs`` each: its events, then one per token row
            for event in record:
                queue = self.queues.get(event.session_id)
                if queue is not None:
                    queue.put_nowait(event)

    async def open(self, session_id: str) -> str:
        engine = await self._engine()
        self.queues[session_id] = asyncio.Queue()
        await engine.call(self.engine.open_session, session_id)
        return session_id

    async def generate(self, session_id: str, prompt: list[int], new_tokens: int):
        engine = await self._engine()
        queue = self.queues[session_id]
        sampling = SamplingParams(max_new_tokens=new_tokens)
        rid = (await engine.call(self.engine.submit, session_id, prompt, sampling)).rid
        while True:
            event = await queue.get()
            if event.turn_id != rid:
                continue
            if event.error_code is not None:
                raise RuntimeError(f"{event.error_code}: {event.error}")
            yield list(event.token_ids)
            if event.finished:
                return

    async def close(self, session_id: str) -> bool:
        engine = await self._engine()
        self.queues.pop(session_id, None)
        return await engine.call(self.engine.close_session, session_id)


def start_peer(config: ReplicaConfig, num_cpus: float) -> Any:
    """Deploy one replica of the peer on the running Ray; its ``DeploymentHandle``."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    deployment = serve.deployment(
        EnginePeer,
        num_replicas=1,
        max_ongoing_requests=10_000,
        ray_actor_options={"num_cpus": num_cpus},
        request_router_config=RequestRouterConfig(request_router_class=CONSISTENT_HASH),
    )
    return serve.run(deployment.bind(config), name=APP, route_prefix=None)


class ServeDriver:
    """The workloads (``lifecycles``, ``token_rounds``) through the peer's handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def _for(self, session_id: str) -> Any:
        return self.handle.options(session_id=session_id)

    async def _turn(self, session_id: str, new_tokens: int) -> int:
        stream = (
            self._for(session_id)
            .options(stream=True)
            .generate.remote(session_id, list(PROMPT), new_tokens)
        )
        return sum([len(ids) async for ids in stream])

    async def _open(self) -> str:
        session_id = secrets.token_hex(16)
        return await self._for(session_id).open.remote(session_id)

    async def _close(self, session_id: str) -> bool:
        return await self._for(session_id).close.remote(session_id)

    async def lifecycle(self, new_tokens: int) -> Lifecycle:
        return await timed_lifecycle(
            self._open, lambda sid: self._turn(sid, new_tokens), self._close
        )

    async def lifecycles(
        self, concurrency: int, seconds: float, warmup: float, new_tokens: int
    ) -> LifecycleSamples:
        return await closed_loop(lambda: self.lifecycle(new_tokens), concurrency, seconds, warmup)

    async def token_rounds(self, sessions: int, new_tokens: int, rounds: int) -> TokenRounds:
        return await token_rounds(
            self._open, lambda sid: self._turn(sid, new_tokens), self._close, sessions, rounds
        )
