"""A bare grpc.aio server of ``SessionService``: what streaming the same messages costs gRPC
itself, the floor of the gateway's CPU per message.

``OpenSession`` and ``CloseSession`` answer at once; ``Generate`` streams ``max_new_tokens``
``GenerateChunk``s of one token and one character each, the last with its finish reason, as an
engine would: every stream gets its next token at each step of a shared clock (``step_s``), so
the messages leave in the same rhythm and the same batches as the gateway's. Per message it does
what any server must: wake the stream, build the message, hand it to gRPC.
"""

from __future__ import annotations

import asyncio
import secrets

import grpc

from protos import session_router_pb2 as pb
from protos import session_router_pb2_grpc as pb_grpc
from router.gateway.service import server_options


class StepClock:
    """Wakes every waiting stream once per step of ``step_s`` seconds."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._step: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    async def tick(self) -> None:
        """Returns at the next step."""
        if self._step is None:
            self._step = asyncio.get_running_loop().create_future()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        await self._step

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            step, self._step = self._step, None
            if step is not None:
                step.set_result(None)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


class BareSessions(pb_grpc.SessionServiceServicer):
    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    async def OpenSession(self, request, context):
        return pb.Session(session_id=secrets.token_hex(16), replica_id="bare")

    async def CloseSession(self, request, context):
        return pb.CloseSessionResponse(was_open=True)

    async def Generate(self, request, context):
        count = request.sampling.max_new_tokens
        for i in range(1, count + 1):
            await self.clock.tick()
            if i < count:
                yield pb.GenerateChunk(token_ids=[65], text="A")
            else:
                yield pb.GenerateChunk(
                    token_ids=[65],
                    text="A",
                    finish_reason=pb.FINISH_REASON_LENGTH,
                    committed_tokens=len(request.tokens.ids) + count,
                )


class BareServer:
    """The bare server on loopback, any free port; ``await start()``, ``await stop()``."""

    def __init__(self, step_s: float) -> None:
        self.clock = StepClock(step_s)
        self.server = grpc.aio.server(options=server_options(30.0))
        pb_grpc.add_SessionServiceServicer_to_server(BareSessions(self.clock), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> BareServer:
        await self.server.start()
        return self

    async def stop(self) -> None:
        self.clock.stop()
        await self.server.stop(None)
