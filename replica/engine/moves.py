"""``SessionMoves``: a replica's side of moving sessions to and from other replicas.

The router drives a move (``router.control.migration``); the replica's part is:
- ``mark(ids)``: mark open sessions *moving*: from now on they take no new turn (a submit is
  answered ``SessionMovingError``, UNAVAILABLE, and the gateway asks the router where the session
  went), a close is refused the same way (the router closes it where it lands), and the idle
  timeout leaves them alone. A turn already running or queued runs to its end. Idempotent.
- ``export(ids)``: mark them, then export those with no turn (``StateTransfer``, one batch); the
  others are reported busy and stay marked, to be exported once their turn has ended.
- ``finish(ids, moved)``: the move is over: released here (reason ``migrated``) when it landed,
  unmarked (the session goes on here) when it did not.
- ``import_(record)``: open the record's sessions here with their state.
A mark older than ``MARK_TTL_S`` is dropped (``expire``): the router that set it has gone
without finishing, and the session goes on here rather than refusing turns forever.
Every method runs on the engine thread, between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replica.api import (
    Exported,
    Imported,
    PoolSnapshot,
    ReleaseReason,
    SessionInfo,
    SessionStates,
)
from replica.engine.scheduler import Scheduler
from replica.sessions.stream_leases import StreamLeases
from replica.sessions.table import SessionRecord, SessionTable
from replica.sessions.transfer import StateTransfer

MARK_TTL_S = 120.0


class SessionMoves:
    def __init__(
        self,
        sessions: SessionTable,
        scheduler: Scheduler,
        leases: StreamLeases,
        transfer: StateTransfer,
        snapshot: Callable[[], PoolSnapshot],
        info: Callable[[SessionRecord], SessionInfo],
    ) -> None:
        self.sessions = sessions
        self.scheduler = scheduler
        self.leases = leases
        self.transfer = transfer
        self.snapshot = snapshot  # the engine's: every answer carries the pools as they are now
        self.info = info
        self.exported_total = 0
        self.imported_total = 0

    def mark(self, ids: Sequence[str]) -> Exported:
        """Mark the open sessions among ``ids`` moving; which are busy, which missing."""
        now = self.sessions.clock()
        busy, missing = [], []
        for sid in ids:
            slot = self.sessions.sessions.get(sid)
            if slot is None or slot.close_reason is not None:
                missing.append(sid)
                continue
            if slot.moving_since is None:
                slot.moving_since = now
            if self.scheduler.find(sid)[0] is not None:
                busy.append(sid)
        ready = tuple(s for s in ids if s not in busy and s not in missing)
        return Exported(ready, tuple(busy), tuple(missing))

    def busy(self, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` with a turn running or queued."""
        return [sid for sid in ids if self.scheduler.find(sid)[0] is not None]

    def export(self, ids: Sequence[str]) -> tuple[Exported, SessionStates]:
        """Mark ``ids`` moving and export those with no turn, in one batch."""
        marked = self.mark(ids)
        slots = [self.sessions.sessions[sid] for sid in marked.exported]
        leases = self.leases.remaining([s.session_id for s in slots])
        record = self.transfer.export(slots, leases)
        exported = tuple(meta.session_id for meta in record.sessions)  # resident ones first
        self.exported_total += len(exported)
        return Exported(exported, marked.busy, marked.missing), record

    def finish(self, ids: Sequence[str], moved: bool) -> PoolSnapshot:
        """End the moves of ``ids``: released (``migrated``) when ``moved``, else unmarked."""
        for sid in ids:
            slot = self.sessions.sessions.get(sid)
            if slot is None or slot.moving_since is None:
                continue
            if moved:
                self.sessions.release_session(sid, ReleaseReason.MIGRATED)
            else:
                slot.moving_since = None
        return self.snapshot()

    def import_(self, records: Sequence[SessionStates], hold_s: float = 0.0) -> Imported:
        """Open the sessions of ``records`` here, with their state and stream leases; one a
        stream held (its record's lease, from a move, or from a checkpoint taken while a stream
        held it) is held at least ``hold_s`` seconds (a failover's: the stream's gateway finds
        it here meanwhile)."""
        opened, refused = [], {}
        for record in records:
            slots, errors = self.transfer.import_(record)
            for meta in record.sessions:
                lease_s = max(meta.lease_s, hold_s) if meta.lease_s > 0 else 0.0
                if lease_s > 0 and meta.session_id not in errors:
                    self.leases.hold([meta.session_id], lease_s)
            opened += [self.info(slot) for slot in slots]
            refused.update({sid: exc.to_actor_error() for sid, exc in errors.items()})
        self.imported_total += len(opened)
        return Imported(tuple(opened), refused, self.snapshot())

    def expire(self) -> list[str]:
        """Drop marks older than ``MARK_TTL_S``; returns the sessions unmarked."""
        now = self.sessions.clock()
        stale = [
            s
            for s in self.sessions.sessions.values()
            if s.moving_since is not None and now - s.moving_since > MARK_TTL_S
        ]
        for slot in stale:
            slot.moving_since = None
        return [s.session_id for s in stale]
