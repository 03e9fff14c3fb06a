"""A bare relay of a Ray stream to grpc.aio streams: the floor of the gateway's CPU per token.

The gateway takes a replica's tokens from one long-lived Ray streaming call (an item per engine
step, a row per session of that step) and fans them out to the gRPC calls streaming those
sessions. ``RelayServer`` does that and nothing else, with none of the gateway's code: a
``RowsProducer`` actor, in a process of its own as a replica is, yields an item of one row for
each of the ``streams`` sessions every ``step_s`` (``RowsItem``: the shape a replica sends); the
server reads each item as the gateway does (``ray.get`` once the read hands it out), puts each
row's token where the call streaming that session waits, and each ``Generate`` call sends what
has come since its last message as one message, the last with its finish reason. A bare gRPC
server (``bench.harness.bare_server``) less this is what reading a Ray stream adds to a message.

Its sessions are the ``streams`` ids the producer writes rows for: ``OpenSession`` hands them out
in turn. The per-turn work of a real gateway (the route, submitting the turn) is not in it.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import ray

from bench.harness.stream_item_floor import RowsItem
from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc
from router.gateway.service import server_options


@ray.remote(num_cpus=0)
class RowsProducer:
    async def stream(self, rows: int, step_s: float):
        """An item of ``rows`` rows every ``step_s`` seconds, until the reader goes."""
        make_item, start = RowsItem(rows), time.monotonic()
        for i in itertools.count():
            await asyncio.sleep(max(0.0, start + (i + 1) * step_s - time.monotonic()))
            yield make_item(i)


class Waiting:
    """The tokens that came for one call and not yet sent; one reader."""

    __slots__ = ("tokens", "texts", "waiter")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.texts: list[str] = []
        self.waiter: asyncio.Future | None = None


class RelaySessions(pb_grpc.SessionServiceServicer):
    def __init__(self, session_ids: list[str]) -> None:
        self.next_id = itertools.cycle(session_ids)
        self.calls: dict[str, Waiting] = {}

    async def OpenSession(self, request, context):
        return pb.Session(session_id=next(self.next_id), replica_id="relay")

    async def CloseSession(self, request, context):
        return pb.CloseSessionResponse(was_open=True)

    def hand_out(self, item: list[tuple[list[str], list[int], list[int], list[str]]]) -> None:
        calls = self.calls
        for session_ids, _, tokens, texts in item:
            for sid, token, text in zip(session_ids, tokens, texts):
                call = calls.get(sid)
                if call is not None:
                    call.tokens.append(token)
                    call.texts.append(text)
                    if call.waiter is not None and not call.waiter.done():
                        call.waiter.set_result(None)

    async def Generate(self, request, context):
        want, sent = request.sampling.max_new_tokens, 0
        call = self.calls[request.session_id] = Waiting()
        try:
            while sent < want:
                while not call.tokens:
                    call.waiter = asyncio.get_running_loop().create_future()
                    await call.waiter
                tokens, texts = call.tokens[: want - sent], call.texts[: want - sent]
                call.tokens, call.texts = [], []
                sent += len(tokens)
                chunk = pb.GenerateChunk(token_ids=tokens, text="".join(texts))
                if sent == want:
                    chunk.finish_reason = pb.FINISH_REASON_LENGTH
                    chunk.committed_tokens = len(request.tokens.ids) + want
                yield chunk
        finally:
            del self.calls[request.session_id]


class RelayServer:
    """The relay on loopback, any free port, on this process's Ray; ``await start()``,
    ``await stop()`` (which also ends the producer)."""

    def __init__(self, step_s: float, streams: int) -> None:
        self.step_s, self.streams = step_s, streams
        self.sessions = RelaySessions(RowsItem(streams).session_ids)
        self.server = grpc.aio.server(options=server_options(30.0))
        pb_grpc.add_SessionServiceServicer_to_server(self.sessions, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.producer = RowsProducer.remote()
        self._pump: asyncio.Task | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> RelayServer:
        await self.server.start()
        self._pump = asyncio.get_running_loop().create_task(self._relay())
        return self

    async def _relay(self) -> None:
        async for ref in self.producer.stream.remote(self.streams, self.step_s):
            self.sessions.hand_out(ray.get(ref))  # as the gateway's pump reads an item

    async def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
        ray.kill(self.producer)
        await self.server.stop(None)
