"""The session workloads straight on the replica actors: what the gateway does, minus gRPC and
the router. Opens, turns and closes are actor calls from this process, batched per replica as the
gateway batches them (``router.gateway.replica_calls``); one long-lived output stream per replica
(``ReplicaClient.read_outputs``, kept open as a gateway keeps it) hands each item's entries to
per-session inboxes; replicas are taken round robin.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from typing import Any

from bench.harness.load import closed_loop
from bench.harness.window import LifecycleSamples
from bench.harness.workload import PROMPT, Lifecycle, TokenRounds, timed_lifecycle, token_rounds
from replica.actor.client import ReplicaClient
from replica.api import ActorError, ReleaseReason, SamplingParams
from router.gateway.batching import CallBatcher
from router.gateway.delivery import hand_out
from router.gateway.inbox import Inbox, pieces
from router.gateway.replica_calls import ReplicaCalls


class DirectDriver:
    """A gateway without gRPC or router over the replica actor ``handles``; ``stop()`` it."""

    def __init__(self, handles: list[Any], use_socket: bool = True) -> None:
        """``use_socket``: read the outputs from the replicas' output sockets, as a gateway
        does (False: from their Ray streams, the gateway's fallback)."""
        self.handles = handles
        self.use_socket = use_socket
        self.gateway_id = f"bench-direct-{secrets.token_hex(4)}"
        self.inboxes: dict[str, Inbox] = {}
        self.items = 0  # output stream items taken, over every replica
        self._next = itertools.cycle(handles)
        self._calls = {id(h): ReplicaCalls(self.gateway_id, h) for h in handles}
        loop = asyncio.get_running_loop()
        self._pumps = [loop.create_task(self._pump(h)) for h in handles]

    async def _pump(self, handle: Any) -> None:
        def take(entries: list) -> None:
            hand_out(entries, self.inboxes)
            self.items += 1

        await ReplicaClient(handle).read_outputs(
            gateway_id=self.gateway_id, on_entries=take, use_socket=self.use_socket
        )

    async def open(self, handle: Any) -> str:
        """Opens a session on ``handle``'s replica (one actor call); returns its id."""
        session_id = secrets.token_hex(16)
        self.inboxes[session_id] = Inbox(session_id, "")
        opened = await self._calls[id(handle)].open((session_id, 0.0, self.gateway_id, "", 0.0))
        info = opened if isinstance(opened, ActorError) else opened[0]
        if isinstance(info, ActorError):
            del self.inboxes[session_id]
            raise RuntimeError(info.code)
        return session_id

    async def turn(self, handle: Any, session_id: str, new_tokens: int) -> int:
        """One turn (one actor call, then the events from the stream); returns its tokens."""
        inbox = self.inboxes[session_id]
        sampling = SamplingParams(max_new_tokens=new_tokens)
        turn_id = await self._calls[id(handle)].submit((session_id, None, list(PROMPT), sampling))
        if isinstance(turn_id, ActorError):
            raise RuntimeError(turn_id.code)
        tokens = 0
        while True:
            for piece in pieces(await inbox.take()):
                if piece.turn_id != turn_id:
                    continue
                if piece.failed:
                    raise RuntimeError(piece.end.error_code)
                tokens += len(piece.token_ids)
                if piece.end is not None:
                    return tokens

    async def close(self, handle: Any, session_id: str) -> None:
        await self._calls[id(handle)].close(session_id, ReleaseReason.CLOSED)
        self.inboxes.pop(session_id, None)

    async def lifecycle(self, new_tokens: int) -> Lifecycle:
        """Open, turn, close on the next replica: three actor calls."""
        handle = next(self._next)
        return await timed_lifecycle(
            lambda: self.open(handle),
            lambda sid: self.turn(handle, sid, new_tokens),
            lambda sid: self.close(handle, sid),
        )

    async def lifecycles(
        self, concurrency: int, seconds: float, warmup: float, new_tokens: int
    ) -> LifecycleSamples:
        """A closed loop of lifecycles (``closed_loop``)."""
        return await closed_loop(lambda: self.lifecycle(new_tokens), concurrency, seconds, warmup)

    async def token_rounds(self, sessions: int, new_tokens: int, rounds: int) -> TokenRounds:
        """``sessions`` sessions on the first replica, ``rounds`` turns on all at once."""
        handle = self.handles[0]
        return await token_rounds(
            lambda: self.open(handle),
            lambda sid: self.turn(handle, sid, new_tokens),
            lambda sid: self.close(handle, sid),
            sessions,
            rounds,
        )

    def batchers(self) -> dict[str, list[CallBatcher]]:
        """Its replica calls' batchers (it makes no router calls)."""
        return {"replica": [b for calls in self._calls.values() for b in calls.batchers]}

    def stop(self) -> None:
        for pump in self._pumps:
            pump.cancel()
