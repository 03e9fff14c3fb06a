"""``SessionTable``: every session of one replica; each keeps its req row, KV pages and mamba
slots between turns (its ``SessionRecord``).

Ownership of a session's slots moves in one cycle:
  open ─► idle (the ``SessionRecord`` owns them) ─► ``restore_to_req`` ─► a running turn (the
  ``Req`` owns them) ─► ``save_from_req`` or ``rollback`` ─► idle ... ─► ``release_session``.
With parking (``Residency``), an idle session's state may instead live in host slots
(``SessionRecord.host``, ``location`` HOST) until its next turn restores it to GPU slots.

A session that moves to another replica is marked ``moving`` from its export until the move is
finished: it takes no new turn meanwhile, and ``adopt`` is how an imported session joins.
``fork`` opens a session holding another's committed state (``Forker``): KV pages are shared by
reference count, so a session's release frees only the pages no fork of it still holds.
States at turn boundaries (the turn's input folded in, and the turn's end) are kept in the
``StateCache``, keyed by the tokens folded in (``SessionRecord.folded_ids``); ``open`` with a prefix
starts from the longest cached state that begins it, the rest of the prefix pending.

``release_session`` frees everything: KV pages, the req row AND the mamba slots (state plus track
buffer), or a parked session's host slots. It is idempotent. Called while a turn runs, it is
deferred: the session takes no new turn, and its slots are freed when the turn ends (the engine
aborts the turn at once, so the wait is at most one engine step). Turns are atomic with a track
buffer: ``restore_to_req`` copies the live mamba state into track-buffer entry 0 (the turn
snapshot), and ``rollback`` copies it back and frees the turn's KV tail. Without a track
buffer, ``rollback`` commits what the turn had folded in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection

import torch

from replica.api import (
    InvalidRequestError,
    ReleaseReason,
    SessionMeta,
    SessionNotFoundError,
    TurnRunningError,
)
from replica.config import DEFAULT_IDLE_TIMEOUT_S
from replica.pools.host_pool import HostSlots
from replica.pools.hybrid_pool import HybridReqToTokenPool, SeqSlots
from replica.pools.state_copy import StateCopier
from replica.sessions.fork import Forker
from replica.sessions.parking import Parker
from replica.sessions.record import SessionRecord, StateLocation
from replica.sessions.request import Req
from replica.sessions.residency import Residency
from replica.sessions.state_cache import StateCache

__all__ = ["SessionRecord", "StateLocation", "SessionTable"]


class SessionTable:
    def __init__(
        self,
        pool: HybridReqToTokenPool,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        failpoints: frozenset[str] = frozenset(),
        parker: Parker | None = None,
        on_changed: Callable[[list[SessionRecord]], None] | None = None,
        on_released: Callable[[str], None] | None = None,
    ) -> None:
        """``on_changed`` is told of every change of a session's state, ``on_released`` of
        every release (the checkpoint log's)."""
        self.pool = pool
        self.kv = pool.kv_pool
        self.cache = StateCache(pool, pool.config.cached_states)
        self.residency = Residency(pool, parker, clock, self.cache)
        copier = (
            parker.copier
            if parker is not None
            else StateCopier(torch.device(pool.config.device).type == "cuda")
        )
        self.forker = Forker(pool, self.residency, copier)
        self.default_idle_timeout_s = idle_timeout_s
        self.clock = clock
        self.failpoints = failpoints
        self.sessions: dict[str, SessionRecord] = {}
        self.opened_total = 0
        self.released_total: Counter[str] = Counter()
        self.on_changed = on_changed or (lambda slots: None)
        self.on_released = on_released or (lambda session_id: None)

    def __len__(self) -> int:
        return len(self.sessions)

    def can_open(self) -> bool:
        return self.residency.can_place_new()

    def open(
        self,
        session_id: str,
        idle_timeout_s: float | None = None,
        tenant: str = "",
        gateway_id: str = "",
        prefix_ids: tuple[int, ...] | None = None,
    ) -> SessionRecord:
        """Reserve a row and 1 + track-buffer mamba slots, or host slots (``Residency``).
        Raises ``PoolExhaustedError`` when the replica has no room. With ``prefix_ids`` (checked
        by the caller) the session holds them: the longest cached state that begins them (when
        the session is resident) gives its state, the rest is pending, folded first next turn."""
        if session_id in self.sessions:
            raise InvalidRequestError(f"session {session_id} is already open")
        seq, host = self.residency.place_new()
        timeout = idle_timeout_s or self.default_idle_timeout_s
        slot = SessionRecord(session_id, seq, timeout, self.clock(), tenant, gateway_id, host=host)
        if prefix_ids is not None:
            self._start_from_prefix(slot, tuple(prefix_ids))
        self.sessions[session_id] = slot
        self.residency.opened(slot)
        self.opened_total += 1
        self.on_changed([slot])  # opened empty, it is noted blank (``CheckpointLog``)
        return slot

    def _start_from_prefix(self, slot: SessionRecord, prefix: tuple[int, ...]) -> None:
        entry = self.cache.lookup(prefix) if slot.seq is not None and prefix else None
        if entry is not None and self.cache.give(entry, slot.req_pool_idx, slot.seq.mamba_pool_idx):
            slot.committed_len = slot.cached_tokens = len(entry.tokens)
            slot.folded_ids = entry.tokens
        slot.pending_ids = prefix[slot.committed_len :]

    def adopt(
        self, meta: SessionMeta, seq: SeqSlots | None, host: HostSlots | None
    ) -> SessionRecord:
        """Join a session imported from another replica into the slots ``seq`` or ``host``
        (``Residency.place_imported``), which hold its state already."""
        slot = SessionRecord(
            meta.session_id,
            seq,
            meta.idle_timeout_s,
            self.clock(),
            meta.tenant,
            committed_len=meta.committed_len,
            pending_ids=tuple(meta.pending_ids),
            host=host,
            folded_ids=None,  # its tokens stayed where it came from
        )
        self.sessions[meta.session_id] = slot
        self.residency.opened(slot)
        self.on_changed([slot])
        return slot

    def fork(self, parent_id: str, child_id: str, gateway_id: str = "") -> SessionRecord:
        """Open ``child_id`` with ``parent_id``'s committed state (``Forker``): same tenant and
        idle timeout, its own slots (whole KV pages shared with the parent). Raises
        ``PoolExhaustedError`` when the replica has no room, ``TurnRunningError`` when the
        parent's committed state cannot be read during its turn; nothing is taken then."""
        parent = self.get(parent_id)
        if child_id in self.sessions:
            raise InvalidRequestError(f"session {child_id} is already open")
        seq, host = self.forker.place(parent)
        slot = SessionRecord(
            child_id,
            seq,
            parent.idle_timeout_s,
            self.clock(),
            parent.tenant,
            gateway_id,
            committed_len=parent.committed_len,
            pending_ids=parent.pending_ids,
            host=host,
            folded_ids=parent.folded_ids,
        )
        self.sessions[child_id] = slot
        self.residency.opened(slot)
        self.opened_total += 1
        self.on_changed([slot])
        return slot

    def get(self, session_id: str) -> SessionRecord:
        slot = self.sessions.get(session_id)
        if slot is None or slot.close_reason is not None:
            raise SessionNotFoundError(
                f"session {session_id} is not open on this replica; open a new session"
            )
        return slot

    def restore_to_req(self, req: Req) -> None:
        """Start a turn: the request takes the session's slots; the pending tokens go first.
        A parked session must be restored first (``Residency.room_for_turn``)."""
        slot = self.get(req.session_id)
        if slot.turn is not None:
            raise TurnRunningError(
                f"session {req.session_id} already has a turn running; "
                "wait for it to finish or interrupt it"
            )
        if slot.seq is None:
            raise RuntimeError(f"session {req.session_id} is parked; restore it before its turn")
        self.residency.turn_started(slot)
        seq = req.seq = slot.seq
        req.prefix_len = req.folded_len = req.kv_len = slot.committed_len
        req.input_ids = [*slot.pending_ids, *req.input_ids]
        if seq.mamba_track_buffer:  # the turn snapshot: entry 0 of the track buffer
            self.pool.mamba_pool.copy(seq.mamba_pool_idx, seq.mamba_track_buffer[0])
        slot.turn = req

    def save_from_req(self, req: Req) -> SessionRecord:
        """End a turn: commit what it folded in; unfolded tokens become pending. The state it
        ends with is cached (``StateCache.keep``)."""
        slot = self._turn_slot(req)
        produced = [*req.input_ids, *req.output_ids]
        slot.pending_ids = tuple(produced[req.turn_folded :])
        slot.committed_len = req.folded_len
        if slot.folded_ids is not None:
            slot.folded_ids = (*slot.folded_ids, *produced[: req.turn_folded])
            self.cache.keep(slot.folded_ids, req.slots.req_pool_idx, req.slots.mamba_pool_idx)
        return self._end_turn(slot, req)

    def input_folded(self, req: Req) -> None:
        """The running turn ``req`` has folded in all its input, none of its output yet: its
        state is cached, keyed by the session's tokens and the turn's input."""
        slot = self._turn_slot(req)
        if slot.folded_ids is not None and req.turn_folded == len(req.input_ids):
            tokens = (*slot.folded_ids, *req.input_ids)
            self.cache.keep(tokens, req.slots.req_pool_idx, req.slots.mamba_pool_idx)

    def rollback(self, req: Req) -> SessionRecord:
        """End a failed or cancelled turn: back to the turn snapshot, or commit what was folded."""
        slot = self._turn_slot(req)
        if not slot.seq.mamba_track_buffer:
            return self.save_from_req(req)
        self.pool.mamba_pool.copy(slot.seq.mamba_track_buffer[0], slot.seq.mamba_pool_idx)
        return self._end_turn(slot, req)

    def _turn_slot(self, req: Req) -> SessionRecord:
        slot = self.sessions.get(req.session_id)
        if slot is None or slot.turn is not req:
            raise RuntimeError(f"request {req.rid} is not the running turn of {req.session_id}")
        return slot

    def _end_turn(self, slot: SessionRecord, req: Req) -> SessionRecord:
        self.kv.truncate(self.pool.req_to_token, slot.req_pool_idx, slot.committed_len, req.kv_len)
        req.release_slots()
        slot.turn = None
        slot.last_active = self.clock()
        if slot.close_reason is not None:
            self._free_slot(slot, slot.close_reason)
        else:
            self.residency.turn_ended(slot)
            self.on_changed([slot])
        return slot

    def release_session(
        self, session_id: str, reason: ReleaseReason = ReleaseReason.CLOSED
    ) -> bool:
        """Free everything the session holds. Idempotent; returns whether it was open."""
        reason = ReleaseReason(reason)
        slot = self.sessions.get(session_id)
        if slot is None or slot.close_reason is not None:
            return False
        if slot.turn is not None:
            slot.close_reason = reason  # freed when the turn ends
        else:
            self._free_slot(slot, reason)
        return True

    def _free_slot(self, slot: SessionRecord, reason: ReleaseReason) -> None:
        del self.sessions[slot.session_id]
        was_resident = not slot.parked
        self.residency.released(slot)  # frees a parked session's host slots
        if was_resident:
            if "leak_kv_on_release" not in self.failpoints:
                self.kv.truncate(self.pool.req_to_token, slot.req_pool_idx, 0, slot.committed_len)
            self.pool.free_rows(slot.req_pool_idx)
            self._free_slot_mamba(slot)
        self.released_total[reason.value] += 1
        self.on_released(slot.session_id)

    def _free_slot_mamba(self, slot: SessionRecord) -> None:
        if "leak_mamba_on_release" not in self.failpoints:
            self.pool.free_mamba(slot.seq)

    def idle_expired(self, now: float | None = None) -> list[str]:
        """Sessions with no turn running, idle for longer than their timeout (except those
        moving: the move ends them or gives them back)."""
        now = self.clock() if now is None else now
        return [
            s.session_id
            for s in self.sessions.values()
            if s.turn is None and not s.moving and now - s.last_active > s.idle_timeout_s
        ]

    def _idle(self, active: Collection[int]) -> list[SessionRecord]:
        """Resident sessions whose row is not in the running batch."""
        return [
            s for s in self.sessions.values() if s.seq is not None and s.req_pool_idx not in active
        ]

    @property
    def parked(self) -> dict[str, SessionRecord]:
        return self.residency.parked

    def session_held_tokens(self, active: Collection[int]) -> int:
        """KV token slots (whole pages) held by sessions whose row is not in ``active``."""
        return sum(self.kv.held_tokens(s.committed_len) for s in self._idle(active))

    def session_held_rows(self, active: Collection[int]) -> list[tuple[int, int]]:
        """``(req row, KV positions)`` of the resident sessions whose row is not in ``active``."""
        return [(s.req_pool_idx, s.committed_len) for s in self._idle(active)]

    def session_held_req_slots(self, active: Collection[int]) -> int:
        return len(self._idle(active))

    def session_held_mamba_slots(self, active: Collection[int]) -> int:
        return len(self._idle(active)) * self.pool.slots_per_seq
