"""One full-duplex ``Converse`` stream: the session lives exactly as long as the stream.

The first request must be ``open``. Each ``input`` starts a turn; input that arrives while a turn
runs interrupts it (barge-in): the tokens generated so far stay committed, that turn ends with
FINISH_REASON_INTERRUPTED, then the new turn starts. ``interrupt`` ends the running turn the same
way without starting another. When the client half-closes, the turn in flight runs to its end,
then the session is released and the stream ends; when the client cancels or disconnects, the
session is released at once (reason ``stream_ended``). A refused input ends the stream with its
status code, and the session is released too.

The stream's inbox carries, in order, the engine's ``TurnEvent``s and the client's messages as
typed items: ``ClientInput``, ``ClientInterrupt``, ``ClientHalfClosed`` and ``ClientFailed``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from protos import session_router_pb2 as pb
from replica.api import ReleaseReason, StatusCode, TurnEvent
from router.control.table import Route
from router.gateway.convert import Refused, session_to_proto
from router.gateway.delivery import Inbox
from router.gateway.gateway import Gateway


@dataclass(frozen=True, slots=True)
class ClientInput:
    request: pb.GenerateRequest


@dataclass(frozen=True, slots=True)
class ClientInterrupt:
    pass


@dataclass(frozen=True, slots=True)
class ClientHalfClosed:
    pass


@dataclass(frozen=True, slots=True)
class ClientFailed:
    error: Exception


class Conversation:
    def __init__(self, gateway: Gateway, requests, context) -> None:
        self.gw = gateway
        self.requests = requests
        self.context = context
        self.route: Route | None = None
        self.inbox: Inbox | None = None
        self.reader: asyncio.Task | None = None

    async def run(self) -> AsyncIterator[pb.ConverseResponse]:
        tenant = self.gw.tenant(self.context)
        first = await anext(aiter(self.requests), None)
        if first is None or first.WhichOneof("kind") != "open":
            raise Refused(StatusCode.INVALID_ARGUMENT, "the first Converse request must be `open`")
        self.route = await self.gw.open(first.open, tenant)
        inbox = self.inbox = self.gw.delivery.claim(self.route)
        yield pb.ConverseResponse(
            opened=session_to_proto(self.route.session_id, self.route.replica_id, self.route.info)
        )
        self.reader = asyncio.get_running_loop().create_task(self._read(inbox))
        live: set[int] = set()  # turns whose chunks we still forward
        half_closed = False
        started = first_token = 0.0
        while not (half_closed and not live):
            match await inbox.get():
                case ClientHalfClosed():
                    half_closed = True
                case ClientFailed(error=error):
                    raise error
                case ClientInterrupt():
                    if live:
                        await self.route.handle.interrupt.remote(self.route.session_id)
                case ClientInput(request=request):
                    if live:
                        await self.route.handle.interrupt.remote(self.route.session_id)
                    live.add(await self.gw.submit(self.route, request))
                    started, first_token = time.perf_counter(), True
                case TurnEvent() as event if event.turn_id in live or event.turn_id == -1:
                    if event.finished:
                        live.discard(event.turn_id)
                    yield pb.ConverseResponse(chunk=self.gw.chunk(event, started, first_token))
                    first_token = first_token and not event.token_ids

    async def _read(self, inbox: Inbox) -> None:
        """Forward the client's requests into the inbox, in order, with the engine's events."""
        try:
            async for request in self.requests:
                kind = request.WhichOneof("kind")
                if kind == "input":
                    sid = request.input.session_id
                    if sid and sid != self.route.session_id:
                        raise Refused(
                            StatusCode.INVALID_ARGUMENT,
                            "input.session_id is not this stream's session; leave it empty",
                        )
                    inbox.put(ClientInput(request.input))
                elif kind == "interrupt":
                    inbox.put(ClientInterrupt())
                else:
                    raise Refused(
                        StatusCode.INVALID_ARGUMENT, "only the first request may be `open`"
                    )
            inbox.put(ClientHalfClosed())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the stream, which ends with it
            inbox.put(ClientFailed(exc))

    def end(self) -> None:
        """Release the session whatever way the stream ended (cleanup survives cancellation)."""
        if self.reader is not None:
            self.reader.cancel()
        if self.route is not None:
            if self.inbox is not None:
                self.gw.delivery.release(self.inbox)
            self.gw.background.spawn(self.gw.release(self.route, ReleaseReason.STREAM_ENDED))
            self.route = None
