"""``Inbox``: what one call streams of one session, and how it becomes messages.

The delivery pump puts the replica's entries for the session into the inbox of the call streaming
it (``replica.api.DeliveryEntry``: tokens of a running turn, a turn's last event, an event about
the session); the call may put its own items too (a Converse's client marks). A call takes
everything at once (``take``) and makes one message of each turn in it (``pieces``): a call
whose client has not taken the last message yet (gRPC's flow control holds the write until the
client's HTTP/2 window has room) finds more waiting when it comes back, and sends it as one
message. So messages grow with the client's backlog, without a timer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from replica.api import (
    ActorError,
    StatusCode,
    TurnEvent,
    clip_id,
    replica_lost_message,
    session_restored_message,
)


class Inbox:
    """The items for one call streaming one session, in order; one reader."""

    __slots__ = ("session_id", "replica_id", "left", "items", "_waiter")

    def __init__(self, session_id: str, replica_id: str) -> None:
        self.session_id = session_id
        self.replica_id = replica_id
        self.left: set[str] = set()  # replicas the call streamed from before: turns may run there
        self.items: list[Any] = []
        self._waiter: asyncio.Future | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[Any]:
        """Every item so far (waits for one)."""
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self.items = self.items, []
        return items


@dataclass(frozen=True, slots=True)
class ReplicaLost:
    """An inbox item: the replica ``replica_id`` the inbox's session was on ended;
    ``committed_tokens`` is where the session continues on another replica (restored from its
    checkpoint, or moved there before); without it, ``unplaced`` is the router's word on the
    session: ABORTED (its state is gone), NOT_FOUND (it was closed), or UNAVAILABLE (the router
    could not say yet, e.g. while it restarts: the session may well continue). Stale once the
    inbox has moved to another replica."""

    replica_id: str
    committed_tokens: int | None
    unplaced: ActorError | None = None

    @property
    def gone(self) -> bool:
        """The session has no place to continue (the router said so)."""
        return self.committed_tokens is None and (
            self.unplaced is None or self.unplaced.code != StatusCode.UNAVAILABLE
        )

    def event(self, session_id: str) -> TurnEvent:
        """The error that ends the turn in flight: UNAVAILABLE (retry the turn) when restored
        or not placed yet, NOT_FOUND when closed meanwhile, else ABORTED."""
        if self.committed_tokens is None:
            code = StatusCode.ABORTED if self.unplaced is None else self.unplaced.code
            if code == StatusCode.UNAVAILABLE:
                error = (
                    f"the replica of session {clip_id(session_id)} died during this turn and "
                    f"where the session continues is not known yet ({self.unplaced.message}); "
                    "retry the turn"
                )
            elif code == StatusCode.NOT_FOUND:
                error = self.unplaced.message
            else:
                code, error = StatusCode.ABORTED, replica_lost_message(session_id)
            return TurnEvent(session_id, -1, error_code=code, error=error)
        error = session_restored_message(session_id, self.committed_tokens)
        return TurnEvent(
            session_id,
            -1,
            committed_tokens=self.committed_tokens,
            error_code=StatusCode.UNAVAILABLE,
            error=error,
        )


@dataclass(slots=True)
class Piece:
    """What one message carries of one turn: its tokens and text so far, and its end (the
    turn's last event: a finish or an error) when it has ended. Turn id -1: the session's
    replica was lost."""

    turn_id: int
    token_ids: list[int]
    text: str
    end: TurnEvent | None = None

    @property
    def failed(self) -> bool:
        return self.end is not None and self.end.error_code is not None


def pieces(items: list[Any]) -> list[Any]:
    """``items`` with each run of one turn's entries merged into one ``Piece``, in order;
    items that are not the replica's (a Converse's client marks, ``ReplicaLost``) pass through
    as they are."""
    out: list[Any] = []
    last: Piece | None = None  # the piece still open to more entries of its turn
    for item in items:
        kind = type(item)
        if kind is list:  # tokens: [session_id, turn_id, token_ids, text]
            if last is not None and last.turn_id == item[1]:
                last.token_ids += item[2]
                last.text += item[3]
            else:
                last = Piece(item[1], item[2], item[3])
                out.append(last)
        elif kind is TurnEvent:
            if last is not None and last.turn_id == item.turn_id:
                last.token_ids += item.token_ids
                last.text += item.text
                last.end = item
            else:
                out.append(Piece(item.turn_id, list(item.token_ids), item.text, item))
            last = None
        else:
            out.append(item)
            last = None
    return out
