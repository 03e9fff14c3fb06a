"""``TurnStreams``: the gateway's one way to stream a session's turns to a call.

``stream_turn`` is a turn from start to end: the session's inbox claimed, the turn submitted
where the session is (following it when it has moved), its chunks, and on the way out the inbox
released and, when the call left before the turn's last chunk, the turn cancelled on the
replica, which rolls the session back. ``start`` is the same for a caller that ends the turn
itself (``TurnStream.end``), and ``claim`` a stream that holds the session for many turns
(Converse). A session that another call of this gateway streams now is refused
(FAILED_PRECONDITION: a turn is in flight).

A ``TurnStream`` is one call's hold on the session's inbox (one call of this gateway streams a
session at a time), from its making to ``end``. A turn is submitted where the session is
(``Follower.on_session``); the inbox then takes the session's events from that replica.
``chunks`` streams the latest turn to its last chunk (a ``Refused`` for a failed turn;
``ReplicaLost`` of the replica the session is on ends it too). ``end`` releases the inbox and,
unless the latest turn ended or its state is gone (ABORTED), cancels it on the replica;
``release`` only releases it (a caller that releases the session itself).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from protos import session_router_pb2 as pb
from replica.api import (
    ChatInput,
    ChatPrompt,
    ForkArgs,
    ForkedTurn,
    ReleaseReason,
    RenderedTurn,
    SamplingParams,
    SessionInfo,
    StatusCode,
)
from router.control.api import Route
from router.gateway.background import Background
from router.gateway.convert import MAX_TEXT_BYTES, Refused, chunk_from_piece
from router.gateway.delivery import Delivery
from router.gateway.follow import Follower
from router.gateway.gateway_metrics import GatewayMetrics
from router.gateway.inbox import Inbox, Piece, ReplicaLost, pieces
from router.gateway.replica_calls import ReplicaCallsByReplica


class TurnStreams:
    def __init__(
        self,
        delivery: Delivery,
        follower: Follower,
        calls: ReplicaCallsByReplica,
        background: Background,
        metrics: GatewayMetrics,
    ) -> None:
        self.delivery = delivery
        self.follower = follower
        self.calls = calls
        self.background = background
        self.metrics = metrics

    def claim(self, route: Route) -> TurnStream:
        """A stream of ``route``'s session for one call (``end`` or ``release`` must follow);
        ``Refused`` when another call of this gateway streams it."""
        inbox = self.delivery.claim(route)
        if inbox is None:
            raise Refused(
                StatusCode.FAILED_PRECONDITION,
                f"session {route.session_id} already has a turn "
                "running; wait for its last chunk or interrupt it",
            )
        return TurnStream(route, inbox, self)

    async def start(
        self,
        route: Route,
        text: str | ChatInput | None,
        ids: list[int] | None,
        sampling: SamplingParams,
        fork: ForkArgs | None = None,
    ) -> TurnStream:
        """A turn (text, a chat to render, or token ids) submitted on ``route``'s session (with
        ``fork``, the session forked first in the same replica command: ``TurnStream.forked``);
        ``TurnStream.chunks`` streams it and ``TurnStream.end`` must follow. Raises ``Refused``
        when it is refused (``NotContinued``: a chat that does not continue the state it
        names), with nothing left held."""
        stream = self.claim(route)
        try:
            await stream.submit(text, ids, sampling, fork)
        except BaseException as exc:
            stream.end(exc.code if isinstance(exc, Refused) else StatusCode.CANCELLED)
            raise
        return stream

    @asynccontextmanager
    async def stream_turn(
        self, route: Route, text: str | None, ids: list[int] | None, sampling: SamplingParams
    ) -> AsyncIterator[TurnStream]:
        """``start``, then the turn's ``TurnStream`` (iterate its ``chunks``) ended on the way
        out with the code the block ended with (cancelled unless it ended OK)."""
        stream = await self.start(route, text, ids, sampling)
        code = StatusCode.CANCELLED
        try:
            yield stream
            code = StatusCode.OK
        except Refused as exc:
            code = exc.code
            raise
        finally:
            stream.end(code)

    async def release_fork(self, submitting: asyncio.Future) -> None:
        """Release the fork a submission made, once it lands (its caller went away)."""
        try:
            route, result = await submitting
        except Exception:  # noqa: BLE001 - refused or failed: no fork was kept
            return
        if type(result) is ForkedTurn and isinstance(result.fork, SessionInfo):
            calls = self.calls.of(route.replica_id, route.handle)
            await calls.close(result.fork.session_id, ReleaseReason.ABORTED)


class TurnStream:
    def __init__(self, route: Route, inbox: Inbox, streams: TurnStreams) -> None:
        """Made by ``TurnStreams.claim`` with the session's claimed ``inbox``."""
        self.route = route
        self.inbox = inbox
        self.streams = streams
        self.turn_id: int | None = None  # the latest turn submitted
        self.finished = False  # its last chunk was taken
        self.started = 0.0  # when it was submitted
        self.first = False  # its first token is still to come
        self.ended = False
        self.forked: ForkedTurn | None = None  # the last submit's, when it asked for a fork
        self.prompt: ChatPrompt | None = None  # the last submit's, when it was a chat

    async def take(self) -> list[Any]:
        """Everything put in the inbox since the last take (waits for one item)."""
        return await self.inbox.take()

    def put(self, item: Any) -> None:
        """Wake ``take`` with an item of the caller's own (a mark of its client's input)."""
        self.inbox.put(item)

    async def submit(
        self,
        text: str | ChatInput | None,
        ids: list[int] | None,
        sampling: SamplingParams,
        fork: ForkArgs | None = None,
    ) -> int:
        """Queue a turn (text or token ids) where the session is; its turn id. With ``fork``
        (``(child_id, lease_s)``) the replica forks the session there first, in the same
        command: ``forked`` then says what became of it. Raises ``Refused``
        when the turn is refused (the replica released the fork it made). A ``ChatInput`` is
        rendered by the replica in the same call (``prompt``: what it came to); ``NotContinued``
        when it does not continue its ``prior_ids`` (nothing was done). A call cancelled
        while the submission is in flight leaves no fork behind: it is released once it lands.
        """
        if isinstance(text, str) and len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
            raise Refused(StatusCode.INVALID_ARGUMENT, f"text longer than {MAX_TEXT_BYTES} bytes")
        args = (text, ids, sampling) if fork is None else (text, ids, sampling, fork)
        call = self.streams.follower.on_session(
            self.route,
            "submit_turns",
            lambda r: self.streams.calls.of(r.replica_id, r.handle).submit((r.session_id, *args)),
        )
        if fork is None:
            route, result = await call
        else:
            submitting = asyncio.ensure_future(call)
            try:
                route, result = await asyncio.shield(submitting)
            except asyncio.CancelledError:
                self.streams.background.spawn(self.streams.release_fork(submitting))
                raise
        self.follow(route)
        if type(result) is RenderedTurn:
            self.prompt, result = result.prompt, result.turn
            if result is None:
                raise NotContinued()
        turn_id, self.forked = result, None
        if type(result) is ForkedTurn:
            turn_id, self.forked = result.turn_id, result
        self.turn_id, self.finished = turn_id, False
        self.started, self.first = time.perf_counter(), True
        return turn_id

    def follow(self, route: Route) -> None:
        """The session answered from ``route``: its events come from that replica now."""
        self.route = route
        self.streams.delivery.move(self.inbox, route)

    def chunk(self, piece: Piece) -> pb.GenerateChunk:
        """The message of ``piece`` (``Refused`` for a failed turn), counted in the metrics."""
        chunk = chunk_from_piece(piece)
        if piece.token_ids:
            if self.first:
                self.streams.metrics.observe_first_token(time.perf_counter() - self.started)
            self.streams.metrics.add_generated_tokens(len(piece.token_ids))
            self.first = False
        return chunk

    async def chunks(self) -> AsyncIterator[pb.GenerateChunk]:
        """The latest turn's chunks, to its last; raises ``Refused`` when it fails."""
        turn_id = self.turn_id
        while not self.finished:
            for piece in pieces(await self.inbox.take()):
                if isinstance(piece, ReplicaLost):
                    if piece.replica_id != self.inbox.replica_id:
                        continue  # the session had moved off that replica
                    piece = Piece(-1, [], "", piece.event(self.route.session_id))
                if piece.turn_id != turn_id and piece.turn_id != -1:
                    continue  # a stale event of an earlier turn
                self.finished = piece.end is not None
                yield self.chunk(piece)
                if self.finished:
                    break

    def end(self, code: StatusCode) -> None:
        """Release the inbox; cancel the latest turn unless it ended or ``code`` is ABORTED
        (its state is gone). Idempotent."""
        if self.ended:
            return
        self.release()
        if self.turn_id is not None and not self.finished and code != StatusCode.ABORTED:
            self.streams.background.spawn(
                self.route.replica.cancel(
                    session_id=self.route.session_id,
                    why="the client cancelled the call",
                    turn_id=self.turn_id,
                )
            )

    def release(self) -> None:
        """Release the inbox only (a caller that releases the session itself). Idempotent."""
        if not self.ended:
            self.ended = True
            self.streams.delivery.release(self.inbox)


class NotContinued(Refused):
    """A chat turn's rendering does not begin with the text of the state it names (the template
    rewrote the past, or the state is not the conversation's): nothing was submitted."""

    def __init__(self) -> None:
        why = "the rendering does not continue the state"
        super().__init__(StatusCode.FAILED_PRECONDITION, why)
