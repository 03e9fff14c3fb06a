"""``TurnHolds``: turn endings held back until their session's checkpoint is stored, for a
bounded time.

A turn's last event waits for the acknowledgement of the checkpoint of that turn's end (the
``CheckpointOutbox`` decides what to hold), so a client that saw the turn end finds its session
there after a failover. A checkpoint that cannot come (its store died, or is slow) must not hold
a turn up: ``release_overdue`` sends on every hold older than ``hold_s`` and notes its session
*given up*; such a session's events are not held again until a checkpoint of it is stored (it
is unprotected meanwhile, which the replica's ``unprotected`` count shows). Used on the actor's
event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, KeysView

from replica.api import TurnEvent

HOLD_S = 3.0  # the longest a turn's last event waits for its checkpoint


class TurnHolds:
    def __init__(self, send: Callable[[list[TurnEvent]], None], hold_s: float = HOLD_S) -> None:
        self.send = send
        self.hold_s = hold_s
        # sessions whose wait outlasted ``hold_s``; replaced whole, read by the engine thread
        self.given_up: frozenset[str] = frozenset()
        self.overdue_total = 0  # holds released by the bound, so far
        self._held: dict[str, list[TurnEvent]] = {}
        self._since: dict[str, float] = {}  # session id -> when its first held event came

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._held

    def holding(self) -> KeysView[str]:
        """The sessions with events held now (a live view)."""
        return self._held.keys()

    def hold(self, event: TurnEvent) -> None:
        if event.session_id not in self._held:
            self._held[event.session_id] = []
            self._since[event.session_id] = time.monotonic()
        self._held[event.session_id].append(event)

    def release(self, session_id: str) -> None:
        """Send the session's held events on (its checkpoint is stored, or none is coming)."""
        self._since.pop(session_id, None)
        events = self._held.pop(session_id, None)
        if events:
            self.send(events)

    def stored(self, session_id: str) -> None:
        """A checkpoint of the session is stored: hold its turn endings again from now on."""
        self.given_up = self.given_up - {session_id}
        self.release(session_id)

    def forget(self, session_id: str) -> None:
        """The session was released."""
        if session_id in self.given_up:
            self.given_up = self.given_up - {session_id}

    def release_overdue(self) -> int:
        """Send on every hold older than ``hold_s``; returns how many."""
        now = time.monotonic()
        late = [sid for sid, since in self._since.items() if now - since > self.hold_s]
        if late:
            self.given_up = self.given_up.union(late)
        for session_id in late:
            self.release(session_id)
        self.overdue_total += len(late)
        return len(late)

    def release_all(self) -> None:
        """The store is gone: send every held event on."""
        for session_id in list(self._held):
            self.release(session_id)
        self.given_up = frozenset()
