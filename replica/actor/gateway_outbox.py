"""``Outbox``: one gateway's output entries on a replica, not yet taken by its stream.

Consecutive token rows are merged into one entry (the order is kept), so a stream that lags
takes fewer, larger items. The outbox is used under its ``GatewayOutputs``' lock; a stream on a
thread waits on ``ready``, a condition of this outbox's own over that lock (one shared by every
outbox woke every idle gateway's thread at each step: 8 % of a replica's rate in a probe with
serve's gateway idle), a stream on the event loop on a future the outbox completes through the
loop. ``close`` ends the stream once it has taken what is here; ``close(superseded=True)`` ends
it at once, leaving the entries to a newer stream of the same gateway.
"""

from __future__ import annotations

import asyncio
import threading

from replica.api import DeliveryEntry, TurnEvent


class Outbox:
    """One gateway's entries not yet taken, with consecutive token rows merged. Used under
    ``lock``, over which a stream on a thread waits on ``ready``; a stream on the event loop
    ``loop`` waits on a future instead."""

    __slots__ = ("entries", "closed", "superseded", "ready", "loop", "_waited", "_future")

    def __init__(
        self,
        lock: threading.RLock,
        waiting: Outbox | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """A fresh outbox, holding the entries ``waiting`` has not handed out when given;
        ``loop``: its stream runs there (else on a thread)."""
        self.entries: list[DeliveryEntry] = waiting.entries if waiting else []
        self.ready = threading.Condition(lock)
        self.loop = loop
        self._waited = False  # a stream on a thread waits for an entry
        self._future: asyncio.Future | None = None  # a stream on the loop waits for one
        self.closed = False
        self.superseded = False  # a newer stream took its entries: it ends without them

    def add(self, event: TurnEvent) -> None:
        if event.finished or event.turn_id < 0:
            self.entries.append(event)
            self._wake()
            return
        n = len(event.token_ids)  # tokens sent on later (held back): rows, the text on the first
        if n:
            texts = [event.text, *[""] * (n - 1)]
            self.add_rows([event.session_id] * n, [event.turn_id] * n, [*event.token_ids], texts)

    def add_rows(
        self, session_ids: list[str], turn_ids: list[int], token_ids: list[int], texts: list[str]
    ) -> None:
        """Rows of one token each (parallel lists, copied)."""
        last = self.entries[-1] if self.entries else None
        if type(last) is tuple:  # merged into the rows just before: the order is kept
            last[0].extend(session_ids)
            last[1].extend(turn_ids)
            last[2].extend(token_ids)
            last[3].extend(texts)
        else:
            self.entries.append((list(session_ids), list(turn_ids), list(token_ids), list(texts)))
        self._wake()

    def close(self, superseded: bool = False) -> None:
        """No more entries: the stream ends once it has taken what is here (at once, leaving
        them, when ``superseded``)."""
        self.closed = True
        self.superseded = self.superseded or superseded
        self._wake()

    @property
    def ended(self) -> bool:
        return self.superseded or (self.closed and not self.entries)

    def _wake(self) -> None:
        if self._waited:
            self.ready.notify_all()
        if self._future is not None:
            self.loop.call_soon_threadsafe(_set_done, self._future)
            self._future = None

    def take(self, timeout: float) -> list[DeliveryEntry]:
        """On the stream's thread: every entry so far, waiting up to ``timeout`` for one unless
        closed ([] if none came)."""
        if not self.entries and not self.closed:
            self._waited = True
            self.ready.wait_for(lambda: self.entries or self.closed, timeout)
            self._waited = False
        return self.taken()

    def take_later(self) -> asyncio.Future | None:
        """On the loop: None when an entry is here or the outbox is closed (``taken`` then),
        else the future its next entry or close completes (``taken`` then)."""
        if self.entries or self.closed:
            return None
        self._future = self.loop.create_future()
        return self._future

    def taken(self) -> list[DeliveryEntry]:
        """Every entry so far (none once superseded: they are the newer stream's)."""
        if self.superseded:
            return []
        entries, self.entries = self.entries, []
        return entries


def _set_done(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
