"""The scheduler: which turns are admitted, and what each engine step runs.

Admission is the only place a turn takes KV: it reserves the pages for its whole turn (input plus
``max_new_tokens``), so a running turn never runs out of KV mid-decode and never needs to be
preempted. Turns are admitted first-come first-served while GPU room can be made for them (with
parking, a parked session is restored first and idle sessions are parked to make room); a turn
that cannot fit while nothing runs (so nothing will free room soon) is refused, never left to
hang. Admission costs O(turns admitted), however many sessions are open or parked.
Every step decodes all running turns that have generated a token, and prefills chunks of the
others within the step's token budget.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from replica.api import PoolExhaustedError, ReplicaError
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.pools.kv_pool import KVTokenPool
from replica.sessions.request import Req
from replica.sessions.table import SessionRecord, SessionTable

log = logging.getLogger(__name__)


class AdmissionError(ReplicaError):
    """Making room for a turn failed (a park, restore or swap raised): that turn fails, the
    sessions involved stay where they were (the parker rolls back), the engine goes on."""


def turn_reservation(req: Req, committed_len: int, pending: int) -> int:
    """Positions the turn may fold in: the session's, its input, all but the last new token."""
    return committed_len + pending + len(req.input_ids) + max(0, req.sampling.max_new_tokens - 1)


def input_left(req: Req) -> int:
    """Input tokens not yet folded in (generated tokens are folded after the input)."""
    return max(0, len(req.input_ids) - req.turn_folded)


def no_room_message(slot: SessionRecord, target: int, kv: KVTokenPool) -> str:
    if slot.parked:
        return (
            "no GPU room to restore this parked session: idle sessions hold the GPU slots and "
            "the host tier has no room for them; close sessions or raise --max-parked-sessions "
            "or --host-kv-tokens"
        )
    return (
        f"the KV pool cannot hold this turn: it needs "
        f"{kv.tokens_needed(slot.committed_len, target)} token slots, {kv.free_tokens} are free "
        "and the rest are held by idle sessions; close idle sessions or shorten the turn"
    )


@dataclass(slots=True)
class StepPlan:
    prefill: list[tuple[Req, int]] = field(default_factory=list)  # (turn, tokens this step)
    decode: list[Req] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


class Scheduler:
    def __init__(
        self,
        pool: HybridReqToTokenPool,
        sessions: SessionTable,
        max_prefill_chunk: int,
        max_batch_tokens: int,
    ) -> None:
        self.pool = pool
        self.sessions = sessions
        self.max_prefill_chunk = max_prefill_chunk
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        # the last plan, while it holds: no prefill in it (prefill moves turns into decode)
        # and no turn admitted or finished since
        self._decode_only: StepPlan | None = None

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def admit(self) -> list[tuple[Req, ReplicaError]]:
        """Admit waiting turns in order while GPU room can be made for them (a parked session is
        restored, idle ones parked as needed: ``Residency.room_for_turn``); returns the turns
        refused, with why. An error while making room refuses that turn only."""
        refused = []
        kv = self.pool.kv_pool
        while self.waiting:
            req = self.waiting[0]
            slot = self.sessions.get(req.session_id)
            target = turn_reservation(req, slot.committed_len, len(slot.pending_ids))
            try:
                room = self.sessions.residency.room_for_turn(slot, target)
            except Exception as exc:  # noqa: BLE001 - one turn's failure, not the engine's
                log.exception("making room for a turn of session %s failed", req.session_id)
                self.waiting.popleft()
                why = f"the replica could not make room for this turn ({exc}); retry the turn"
                refused.append((req, AdmissionError(why)))
                continue
            if not room:
                if self.running:
                    break  # running turns will free room when they end
                self.waiting.popleft()
                refused.append((req, PoolExhaustedError(no_room_message(slot, target, kv))))
                continue
            self.waiting.popleft()
            self.sessions.restore_to_req(req)
            try:
                kv.extend(self.pool.req_to_token, req.slots.req_pool_idx, req.kv_len, target)
            except PoolExhaustedError as err:  # checked above; never leave the turn half-started
                self.sessions.rollback(req)
                refused.append((req, err))
                continue
            req.kv_len = target
            self.running.append(req)
            self._decode_only = None
        return refused

    def plan(self) -> StepPlan:
        """What the next step runs. A decode-only plan is kept (the same lists) until a turn
        is admitted or finishes, so a step of the same turns costs O(1) here."""
        if self._decode_only is not None:
            return self._decode_only
        plan = StepPlan()
        budget = self.max_batch_tokens
        for req in self.running:
            if input_left(req) == 0:
                if req.output_ids:
                    plan.decode.append(req)
                    budget -= 1
        for req in self.running:
            left = input_left(req)
            if left and budget > 0:
                n = min(left, self.max_prefill_chunk, budget)
                plan.prefill.append((req, n))
                budget -= n
        if not plan.prefill:
            self._decode_only = plan
        return plan

    def finish(self, req: Req) -> None:
        self.running.remove(req)
        self._decode_only = None

    def find(self, session_id: str) -> tuple[Req | None, bool]:
        """The session's turn, and whether it is running (else waiting)."""
        for req in self.running:
            if req.session_id == session_id:
                return req, True
        for req in self.waiting:
            if req.session_id == session_id:
                return req, False
        return None, False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
