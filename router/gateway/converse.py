"""One full-duplex ``Converse`` stream: the session lives exactly as long as the stream.

The first request must be ``open``. Each ``input`` starts a turn; input that arrives while a turn
runs interrupts it (barge-in): the tokens generated so far stay committed, that turn ends with
FINISH_REASON_INTERRUPTED, then the new turn starts. ``interrupt`` ends the running turn the same
way without starting another. Inputs that arrive faster than turns can start are merged, in
order, into the next turn (``router.gateway.converse_inputs``): nothing is dropped and memory is
bounded. When the client half-closes, the turn in flight runs to its end, then the session is
released and the stream ends; when the client cancels or disconnects (gRPC keepalive finds a dead
peer), the session is released at once (reason ``stream_ended``). A refused input ends the
stream with its status code, and the session is released too. The idle timeout does not apply
while the stream is open (``router.gateway.stream_leases``).

The stream's inbox carries the replica's entries for the session and a ``ClientReady`` mark
whenever the client's messages are waiting in ``PendingInputs``; each turn's entries taken at once
go out as one message (``router.gateway.inbox``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from protos import session_router_pb2 as pb
from replica.api import ReleaseReason, StatusCode
from router.control.api import Route
from router.gateway.converse_inputs import (
    ClientFailed,
    ClientHalfClosed,
    ClientInput,
    ClientInterrupt,
    PendingInputs,
)
from router.gateway.convert import Refused, check, session_to_proto, turn_of
from router.gateway.gateway import Gateway
from router.gateway.inbox import Piece, ReplicaLost, pieces
from router.gateway.stream_leases import LEASE_S
from router.gateway.turn_streams import TurnStream


@dataclass(frozen=True, slots=True)
class ClientReady:
    """The client's messages wait in the stream's ``PendingInputs``."""


class Conversation:
    def __init__(self, gateway: Gateway, requests, context) -> None:
        self.gw = gateway
        self.requests = requests
        self.context = context
        self.route: Route | None = None
        self.stream: TurnStream | None = None
        self.reader: asyncio.Task | None = None
        self.live: dict[int, str] = {}  # turns whose chunks we still forward -> their replica

    async def run(self) -> AsyncIterator[pb.ConverseResponse]:
        tenant = self.gw.tenant(self.context)
        first = await anext(aiter(self.requests), None)
        if first is None or first.WhichOneof("kind") != "open":
            raise Refused(StatusCode.INVALID_ARGUMENT, "the first Converse request must be `open`")
        route = self.route = await self.gw.open(
            first.open, tenant, self.context.time_remaining(), LEASE_S
        )
        self.gw.leases.hold(route)
        stream = self.stream = self.gw.turns.claim(route)
        yield pb.ConverseResponse(
            opened=session_to_proto(route.session_id, route.replica_id, route.info)
        )
        pending = PendingInputs(lambda: stream.put(ClientReady()))
        self.reader = asyncio.get_running_loop().create_task(self._read(pending))
        half_closed = False
        while not (half_closed and not self.live):
            for item in pieces(await stream.take()):
                match item:
                    case ClientReady():
                        for message in pending.take():
                            half_closed = await self._act(message) or half_closed
                    case ReplicaLost() as lost if self._concerns(lost):
                        for chunk in await self._replica_lost(lost):
                            yield pb.ConverseResponse(chunk=chunk)
                    case Piece() as piece if piece.turn_id in self.live or piece.turn_id == -1:
                        if piece.end is not None:
                            self.live.pop(piece.turn_id, None)
                        yield pb.ConverseResponse(chunk=stream.chunk(piece))

    async def _act(self, message) -> bool:
        """Act on one of the client's messages, in order; True when it is the half-close."""
        match message:
            case ClientHalfClosed():
                return True
            case ClientFailed(error=error):
                raise error
        if self.live:  # an interrupt, or an input that barges in
            route, _ = await self.gw.on_session(
                self.route, "interrupt", lambda r: r.replica.interrupt(session_id=r.session_id)
            )
            self._moved(route)
        if isinstance(message, ClientInput):
            turn_id = await self.stream.submit(*turn_of(message.request))
            self._moved(self.stream.route)
            self.live[turn_id] = self.stream.route.replica_id
        return False

    def _moved(self, route: Route) -> None:
        """The session answered from ``route``: it may have moved there."""
        if route.replica_id != self.route.replica_id:
            self.route = route
            self.gw.leases.hold(route)
        self.stream.follow(route)

    def _concerns(self, lost: ReplicaLost) -> bool:
        """Whether the session was on the replica that ended, or a turn of ours ran there."""
        return lost.replica_id == self.route.replica_id or lost.replica_id in self.live.values()

    async def _replica_lost(self, lost: ReplicaLost) -> list[pb.GenerateChunk]:
        """A replica the session was on ended (it died, or was stopped once the session had
        moved off it). The session's state gone (the router says so): the stream ends ABORTED
        (NOT_FOUND if it was closed meanwhile). Elsewhere (restored from its checkpoint, or
        moved; or not known yet, then asked of the router again): the stream goes on there,
        and each turn in flight on that replica ends INTERRUPTED at the committed tokens the
        session continues at (what the client says next continues from there)."""
        if lost.replica_id == self.route.replica_id:
            if lost.gone:
                event = lost.event(self.route.session_id)
                raise Refused(event.error_code, event.error)
            self._moved(check(await self.gw.relocate(self.route)))
        ended = [turn for turn, replica in self.live.items() if replica == lost.replica_id]
        committed = lost.committed_tokens
        if ended and committed is None:  # the session had moved on before: ask where it is
            route, info = await self.gw.on_session(
                self.route, "get_session", lambda r: r.replica.get_session(session_id=r.session_id)
            )
            self._moved(route)
            committed = info.committed_tokens
        for turn in ended:
            del self.live[turn]
        return [
            pb.GenerateChunk(finish_reason=pb.FINISH_REASON_INTERRUPTED, committed_tokens=committed)
            for _ in ended
        ]

    async def _read(self, pending: PendingInputs) -> None:
        """Hand the client's requests to ``pending``, in order; waits while it is full."""
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
                    await pending.put(ClientInput(request.input))
                elif kind == "interrupt":
                    await pending.put(ClientInterrupt())
                else:
                    raise Refused(
                        StatusCode.INVALID_ARGUMENT, "only the first request may be `open`"
                    )
            await pending.put(ClientHalfClosed())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the stream, which ends with it
            await pending.put(ClientFailed(exc))

    def end(self) -> None:
        """Release the session whatever way the stream ended (cleanup survives cancellation)."""
        if self.reader is not None:
            self.reader.cancel()
        if self.route is not None:
            self.gw.leases.drop(self.route.session_id)
            if self.stream is not None:
                self.stream.release()
            self.gw.background.spawn(self.gw.release(self.route, ReleaseReason.STREAM_ENDED))
            self.route = None
