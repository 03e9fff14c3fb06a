"""One ``Generate`` call: a turn streamed to one client."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from protos import session_router_pb2 as pb
from replica.api import SamplingParams, StatusCode
from router.control.api import Route
from router.gateway.convert import Refused
from router.gateway.gateway import Gateway
from router.gateway.inbox import Inbox, Piece, ReplicaLost, pieces


class GenerateCall:
    """One turn streamed to one client, a message per ``Inbox.take`` (everything the turn
    produced since the last message). If the call ends before the turn's last chunk (client
    cancel, deadline), the turn is cancelled on the replica, which rolls the session back."""

    def __init__(
        self,
        gateway: Gateway,
        request: pb.GenerateRequest | None = None,
        context=None,
        turn: tuple[str | None, list[int] | None, SamplingParams] | None = None,
    ) -> None:
        """A gRPC ``request`` (with its call's ``context``), or a ``turn`` (text, token ids,
        sampling) that another front end built, streamed with ``stream``."""
        self.gw, self.request, self.context, self.turn = gateway, request, context, turn
        self.route: Route | None = None
        self.inbox: Inbox | None = None
        self.turn_id: int | None = None
        self.started = 0.0
        self.finished = False

    async def run(self) -> AsyncIterator[pb.GenerateChunk]:
        route = await self.gw.route(self.request.session_id, self.gw.tenant(self.context))
        async for chunk in self.stream(route):
            yield chunk

    async def stream(self, route: Route) -> AsyncIterator[pb.GenerateChunk]:
        """The turn on ``route``'s session (already checked as the caller's), chunk by chunk;
        raises ``Refused`` when the turn fails. ``end`` must follow, however the stream ends."""
        await self.start(route)
        async for chunk in self.chunks():
            yield chunk

    async def start(self, route: Route) -> None:
        """Submit the turn; raises ``Refused`` when the replica refuses it (``end`` follows)."""
        self.started = time.perf_counter()
        self.route = route
        self.inbox = self.gw.delivery.claim(route)
        if self.inbox is None:
            raise Refused(
                StatusCode.FAILED_PRECONDITION,
                f"session {route.session_id} already has a turn "
                "running; wait for its last chunk or interrupt it",
            )
        if self.turn is None:
            self.route, self.turn_id = await self.gw.submit(route, self.request)
        else:
            self.route, self.turn_id = await self.gw.submit_turn(route, *self.turn)
        self.gw.delivery.move(self.inbox, self.route)

    async def chunks(self) -> AsyncIterator[pb.GenerateChunk]:
        """The started turn's chunks, to its last; raises ``Refused`` when it fails."""
        first, turn_id = True, self.turn_id
        while not self.finished:
            for piece in pieces(await self.inbox.take()):
                if isinstance(piece, ReplicaLost):
                    if piece.replica_id != self.inbox.replica_id:
                        continue  # the session had moved off that replica
                    piece = Piece(-1, [], "", piece.event(self.route.session_id))
                if piece.turn_id != turn_id and piece.turn_id != -1:
                    continue  # a stale event of an earlier turn
                self.finished = piece.end is not None
                yield self.gw.chunk(piece, self.started, first)
                first = first and not piece.token_ids
                if self.finished:
                    break

    def end(self, code: StatusCode) -> None:
        if self.inbox is None:
            return
        self.gw.delivery.release(self.inbox)
        if self.turn_id is not None and not self.finished and code != StatusCode.ABORTED:
            self.gw.background.spawn(
                self.route.replica.cancel(
                    session_id=self.route.session_id,
                    why="the client cancelled the call",
                    turn_id=self.turn_id,
                )
            )
