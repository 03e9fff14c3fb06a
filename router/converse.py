"""One full-duplex ``Converse`` stream: the session lives exactly as long as the stream.

The first request must be ``open``. Each ``input`` starts a turn; input that arrives while a turn
runs interrupts it (barge-in): the tokens generated so far stay committed, that turn ends with
FINISH_REASON_INTERRUPTED, then the new turn starts. ``interrupt`` ends the running turn the same
way without starting another. When the client half-closes, the turn in flight runs to its end,
then the session is released and the stream ends; when the client cancels or disconnects, the
session is released at once (reason ``stream_ended``). A refused input ends the stream with its
status code, and the session is released too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from protos import session_router_pb2 as pb
from replica.outputs import TurnEvent
from router.convert import Refused, session_to_proto
from router.table import Route

if TYPE_CHECKING:
    from router.gateway import Gateway

_EOF = object()


class Conversation:
    def __init__(self, gateway: Gateway, requests, context) -> None:
        self.gw = gateway
        self.requests = requests
        self.context = context
        self.route: Route | None = None
        self.inbox: asyncio.Queue | None = None
        self.reader: asyncio.Task | None = None

    async def run(self) -> AsyncIterator[pb.ConverseResponse]:
        tenant = self.gw.tenant(self.context)
        first = await anext(aiter(self.requests), None)
        if first is None or first.WhichOneof("kind") != "open":
            raise Refused("INVALID_ARGUMENT", "the first Converse request must be `open`")
        self.route = await self.gw.open(first.open, tenant)
        inbox = self.inbox = self.gw.cluster.claim_inbox(self.route.session_id)
        yield pb.ConverseResponse(
            opened=session_to_proto(self.route.session_id, self.route.replica_id, self.route.info)
        )
        self.reader = asyncio.get_running_loop().create_task(self._read(inbox))
        live: set[int] = set()  # turns whose chunks we still forward
        half_closed = False
        started = first_token = 0.0
        while not (half_closed and not live):
            item = await inbox.get()
            if item is _EOF:
                half_closed = True
            elif isinstance(item, BaseException):
                raise item
            elif isinstance(item, tuple):  # ("input", request) or ("interrupt", None)
                kind, request = item
                if live:
                    await self.route.handle.interrupt.remote(self.route.session_id)
                if kind == "input":
                    live.add(await self.gw.submit(self.route, request))
                    started, first_token = time.perf_counter(), True
            elif isinstance(item, TurnEvent) and (item.turn_id in live or item.turn_id == -1):
                if item.finished:
                    live.discard(item.turn_id)
                yield pb.ConverseResponse(chunk=self.gw.chunk(item, started, first_token))
                first_token = first_token and not item.token_ids

    async def _read(self, inbox: asyncio.Queue) -> None:
        """Forward the client's requests into the inbox, in order, with the engine's events."""
        try:
            async for request in self.requests:
                kind = request.WhichOneof("kind")
                if kind == "input":
                    sid = request.input.session_id
                    if sid and sid != self.route.session_id:
                        raise Refused(
                            "INVALID_ARGUMENT",
                            "input.session_id is not this stream's session; leave it empty",
                        )
                    inbox.put_nowait(("input", request.input))
                elif kind == "interrupt":
                    inbox.put_nowait(("interrupt", None))
                else:
                    raise Refused("INVALID_ARGUMENT", "only the first request may be `open`")
            inbox.put_nowait(_EOF)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the stream, which ends with it
            inbox.put_nowait(exc)

    def end(self) -> None:
        """Release the session whatever way the stream ended (cleanup survives cancellation)."""
        if self.reader is not None:
            self.reader.cancel()
        if self.route is not None:
            if self.inbox is not None:
                self.gw.cluster.drop_inbox(self.route.session_id, self.inbox)
            self.gw.cluster.background(self.gw.cluster.release(self.route, "stream_ended"))
            self.route = None
