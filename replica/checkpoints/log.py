"""``CheckpointLog``: the engine's side of session checkpoints (``--session-checkpoints``).

Whenever a session's state changes (it opens, a turn ends, a queued input is folded into its
pending tokens, it arrives by migration) it is noted *changed*; after the engine step in which
that happened, ``take`` exports every changed idle session's state (with the exporter it is
given, ``StateTransfer.export``: one ``SessionStates`` record per session, so each is stored and
freed on its own) and hands the records, with the sessions released since, to the replica's
``CheckpointOutbox``. A session's first record for the store that follows now is its whole
state; each after it is a delta (``replica.checkpoints.chain``): the recurrent state and the KV
positions since the one before. This is the only part of checkpointing on the engine thread:
one copy of what changed, right after the step; writing it out happens on the actor's event
loop, off the token path.

A session that holds nothing yet (opened empty, or rolled back to nothing) is not exported: it
is handed on as ``blank`` (its id, tenant and idle timeout), which the store keeps so that a
failover that no router remembers it for (the router restarted meanwhile) opens it again empty.

Nothing is exported while no checkpoint store follows the replica (``enabled`` False): a session
changed meanwhile gets its first checkpoint at its next change (or when a store connects), and
those of them holding committed state are handed on as ``unsaved`` (a failover must not open
them again empty: a client may have seen their turn end).

``released`` notes every release of a session that has a checkpoint, so its checkpoint is freed
(``dropped``); the failpoint ``leak_checkpoint_on_release`` drops none, so a leaked checkpoint
shows in the accounting (the session is counted released, the store still holds its state).
Used on the engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replica.api import SessionStates
from replica.checkpoints.chain import per_session

if TYPE_CHECKING:  # the store reads this package and never needs torch
    from replica.sessions.record import SessionRecord


@dataclass(frozen=True, slots=True)
class CheckpointBatch:
    """What one engine step leaves to write: each changed session's state (``saved``), the
    sessions whose checkpoints to free (``dropped``), those released (``released``: the
    same, unless a failpoint leaks), those whose committed state changed while no store
    followed (``unsaved``: no checkpoint of it was taken), the changed sessions that hold
    nothing (``blank``: session id, tenant, idle timeout), and those of ``saved`` whose turn's
    end need not wait for its checkpoint (``unheld``: its turns name the state they continue)."""

    saved: list[SessionStates] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    unsaved: list[str] = field(default_factory=list)
    blank: list[tuple[str, str, float]] = field(default_factory=list)
    unheld: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.saved or self.released or self.unsaved or self.blank)


class CheckpointLog:
    def __init__(self, leak_on_release: bool = False) -> None:
        """Built before the session table, which reports every change and release to it."""
        self.leak_on_release = leak_on_release
        self.enabled = False  # a store follows the replica (set from the actor's event loop)
        self._changed: dict[str, SessionRecord] = {}
        self._checkpointed: set[str] = set()  # sessions with a checkpoint written or on its way
        # those taken since the store that follows now connected: their committed length then
        self._sent: dict[str, int] = {}
        self._dropped: list[str] = []
        self._released: list[str] = []

    def changed(self, slots: Iterable[SessionRecord]) -> None:
        for slot in slots:
            self._changed[slot.session_id] = slot

    def released(self, session_id: str) -> None:
        self._changed.pop(session_id, None)
        self._sent.pop(session_id, None)
        if session_id in self._checkpointed:
            self._checkpointed.discard(session_id)
            self._released.append(session_id)
            if not self.leak_on_release:
                self._dropped.append(session_id)

    def noted(self, session_id: str) -> bool:
        """Whether a checkpoint of the session was taken for the store that follows now, or is
        taken after this step (it is idle)."""
        slot = self._changed.get(session_id)
        return session_id in self._sent or (slot is not None and slot.turn is None)

    def renew(self, slots: Iterable[SessionRecord]) -> None:
        """A new store follows, which holds none of ``slots`` (every open session): each is
        checkpointed again (an idle one after this step, one in a turn at its end)."""
        self._sent.clear()
        self.changed(slots)

    def take(self, export: Callable[..., SessionStates]) -> CheckpointBatch:
        """Export every changed idle session (``export(records, kv_from=...)``, all in one
        copy, then one record each: a delta when the store has its state before) and the
        releases since the last ``take``; a session whose turn runs again waits for that
        turn's end."""
        unsaved = []
        if not self.enabled:
            unsaved = [sid for sid, slot in self._changed.items() if slot.committed_len > 0]
            self._changed.clear()
        ready = [s for s in self._changed.values() if s.turn is None]
        held, kv_from, blank, unheld = [], {}, [], []
        for slot in ready:
            sid = slot.session_id
            del self._changed[sid]
            self._checkpointed.add(sid)
            if slot.committed_len == 0 and not slot.pending_ids:
                blank.append((sid, slot.tenant, slot.idle_timeout_s))
                continue
            before = self._sent.get(sid, 0)
            if 0 < before <= slot.committed_len:
                kv_from[sid] = before
            held.append(slot)
            self._sent[sid] = slot.committed_len
            if slot.names_state:
                unheld.append(sid)
        saved = per_session(export(held, kv_from=kv_from)) if held else []
        batch = CheckpointBatch(saved, self._dropped, self._released, unsaved, blank, unheld)
        self._dropped, self._released = [], []
        return batch
