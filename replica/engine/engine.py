"""The replica's engine: continuous batching of session turns over one hybrid model.

Single-threaded by contract: every method runs on the thread that calls ``step`` (the async
wrapper queues commands and applies them between steps), so the pools change only between steps
and every snapshot is consistent. ``step`` admits waiting turns, runs one forward for the decode
batch and the prefill chunks, samples, streams ``TurnEvent``s, and ends finished turns. When the
engine goes idle it checks the accounting invariant (strict mode raises).

How turns end is ``TurnOutputs``'s (closing a session during a turn cancels the turn). Errors
stay with the turns they touch; only an error outside any turn escapes ``step``, and then the
engine is dead: the replica reports itself dead and is replaced.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from replica.accounting import InvariantChecker, count_pools
from replica.api import (
    FinishReason,
    PoolSnapshot,
    ReleaseReason,
    ReplicaDrainingError,
    SamplingParams,
    SessionInfo,
    StatusCode,
    TurnEvent,
    TurnRunningError,
)
from replica.config import ReplicaConfig
from replica.engine.model_runner import ModelRunner
from replica.engine.scheduler import Scheduler
from replica.engine.turn_check import check_turn
from replica.engine.turn_outputs import TurnOutputs
from replica.model import HybridModel, Tokenizer
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.sessions.parking import Parker
from replica.sessions.request import Req
from replica.sessions.session import SessionSlot, StreamingSession
from replica.sessions.stream_leases import StreamLeases

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        config: ReplicaConfig,
        model: HybridModel,
        tokenizer: Tokenizer,
        replica_id: str = "replica-0",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` is what idle timeouts and stream leases are measured by (tests pass
        their own)."""
        self.config = config
        self.replica_id = replica_id
        self.incarnation = uuid.uuid4().hex[:12]
        self.tokenizer = tokenizer
        self.model_config = model.cfg
        self.pool = HybridReqToTokenPool(model.cfg, config.pools)
        self.sessions = StreamingSession(
            self.pool,
            config.session_idle_timeout_s,
            clock=clock,
            failpoints=config.failpoints,
            parker=Parker.build(self.pool, model.cfg, config.pools),
        )
        self.scheduler = Scheduler(
            self.pool, self.sessions, config.max_prefill_chunk, config.max_batch_tokens
        )
        self.runner = ModelRunner(model, self.pool)
        self.checker = InvariantChecker(config.strict)
        self.leases = StreamLeases(self.sessions.clock)
        self.turns = TurnOutputs(tokenizer, self.scheduler, self.sessions)
        self.draining = False
        self._snapshot_seq = itertools.count(1)

    # ----- sessions -------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        tenant: str = "",
        gateway_id: str = "",
    ) -> SessionInfo:
        """Open a session (its slots are reserved now); the idle timeout is capped by the
        replica's. ``gateway_id`` is where its turn events go until a turn says otherwise."""
        if self.draining:
            raise ReplicaDrainingError(f"replica {self.replica_id} is draining")
        cap = self.config.session_idle_timeout_s
        timeout = min(idle_timeout_s, cap) if idle_timeout_s > 0 else cap
        return self.info(self.sessions.open(session_id, timeout, tenant, gateway_id))

    def close_session(self, session_id: str, reason: ReleaseReason = ReleaseReason.CLOSED) -> bool:
        """Release the session; a turn in flight is cancelled first. Idempotent."""
        self.cancel(session_id, "session closed")
        return self.sessions.release_session(session_id, reason)

    def info(self, slot: SessionSlot) -> SessionInfo:
        return SessionInfo(
            slot.session_id,
            slot.committed_tokens,
            self.config.pools.max_context,
            self.scheduler.find(slot.session_id)[0] is not None,
            slot.idle_timeout_s,
            slot.parked,
        )

    def session_info(self, session_id: str) -> SessionInfo:
        return self.info(self.sessions.get(session_id))

    def session_tenants(self) -> dict[str, str]:
        """Every open session and its tenant (what a restarted router rebuilds its table from)."""
        return {
            s.session_id: s.tenant
            for s in self.sessions.sessions.values()
            if s.close_reason is None
        }

    def release_idle(self) -> list[str]:
        """Release the sessions idle past their timeout, except those with a turn waiting and
        those a stream holds open (``leases``); returns their ids."""
        self.leases.prune(self.sessions.sessions)
        busy = {req.session_id for req in self.scheduler.waiting}
        expired = [
            sid
            for sid in self.sessions.idle_expired()
            if not (sid in busy or self.leases.held(sid))
        ]
        for sid in expired:
            self.sessions.release_session(sid, ReleaseReason.IDLE_TIMEOUT)
        return expired

    def park_idle(self) -> int:
        """Park the sessions idle for ``park_after_idle_s`` (when set); returns how many."""
        if not self.config.park_after_idle_s:
            return 0
        return self.sessions.residency.park_idle(self.config.park_after_idle_s)

    # ----- turns ----------------------------------------------------------------------------

    def submit(
        self,
        session_id: str,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        gateway_id: str | None = None,
    ) -> Req:
        """Queue a turn; its events go to ``gateway_id`` (from now on, the session's gateway).
        Validates everything up front; raises a typed ``ReplicaError``."""
        sampling = sampling or SamplingParams()
        slot = self.sessions.get(session_id)
        if self.scheduler.find(session_id)[0] is not None:
            raise TurnRunningError(
                f"session {session_id} already has a turn running; wait for "
                "its last chunk or interrupt it"
            )
        check_turn(
            slot, input_ids, sampling, self.model_config.vocab_size, self.config.pools.max_context
        )
        if gateway_id is not None:
            slot.gateway_id = gateway_id
        self.sessions.residency.touch(slot)
        req = Req(session_id, list(input_ids), sampling)
        if not input_ids and not slot.pending_ids:
            # Nothing to fold and nothing to generate: the turn is done (it would never be
            # scheduled, so queueing it would leave the engine busy forever).
            self.turns.report_end(req, FinishReason.LENGTH, slot)
            return req
        self.scheduler.add(req)
        return req

    def interrupt(self, session_id: str) -> bool:
        """Barge-in: end the session's turn now (INTERRUPTED). What it generated stays committed,
        and so does its whole input: what was not folded in yet is folded first next turn,
        whether the turn was running or still waiting to be admitted."""
        req, running = self.scheduler.find(session_id)
        if req is None:
            return False
        if running:
            self.turns.commit(req, FinishReason.INTERRUPTED)
        else:
            self.scheduler.waiting.remove(req)
            slot = self.sessions.get(session_id)
            slot.pending_ids = (*slot.pending_ids, *req.input_ids)  # fits: checked at submit
            self.turns.report_end(req, FinishReason.INTERRUPTED, slot)
        return True

    def cancel(
        self, session_id: str, why: str = "turn cancelled", turn_id: int | None = None
    ) -> bool:
        """End the session's turn (only turn ``turn_id`` when given) and roll it back (atomic
        turns); reports CANCELLED. Returns whether a turn was cancelled."""
        req, running = self.scheduler.find(session_id)
        if req is None or (turn_id is not None and req.rid != turn_id):
            return False
        if running:
            self.turns.fail(req, StatusCode.CANCELLED, why)
        else:
            self.scheduler.waiting.remove(req)
            slot = self.sessions.get(session_id)
            self.turns.emit(slot, req, error_code=StatusCode.CANCELLED, error=why)
        return True

    # ----- the step -------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[TurnEvent]:
        """Run one engine step; returns the events it (and commands since the last) produced."""
        if "engine_step_raises" in self.config.failpoints:
            raise RuntimeError("failpoint engine_step_raises: the engine step failed")
        for req, err in self.scheduler.admit():
            slot = self.sessions.get(req.session_id)
            self.turns.emit(slot, req, error_code=err.code, error=str(err))
        plan = self.scheduler.plan()
        if plan.decode:
            self.turns.run(
                plan.decode, lambda: self.runner.decode(plan.decode), after_prefill=False
            )
        if plan.prefill:
            reqs = [req for req, _ in plan.prefill]
            self.turns.run(reqs, lambda: self.runner.extend_batch(plan.prefill), after_prefill=True)
        if not self.has_work:
            self.check_invariant()
        return self.take_events()

    def take_events(self) -> list[TurnEvent]:
        return self.turns.take()

    # ----- accounting -----------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            replica_id=self.replica_id,
            incarnation=self.incarnation,
            pools=count_pools(self.pool, self.sessions, self.scheduler.running),
            open_sessions=len(self.sessions),
            running_requests=len(self.scheduler.running),
            waiting_requests=len(self.scheduler.waiting),
            taken_at=time.time(),
            seq=next(self._snapshot_seq),
            draining=self.draining,
            sessions_opened_total=self.sessions.opened_total,
            sessions_released_total=dict(self.sessions.released_total),
            parking=self.sessions.residency.stats(),
        )

    def check_invariant(self) -> PoolSnapshot:
        """Snapshot and check it (strict mode raises ``LeakError``); also the free lists."""
        snap = self.snapshot()
        self.checker.check(snap)
        self.pool.check_integrity()
        return snap

    def close_all(self, reason: ReleaseReason = ReleaseReason.CLOSED) -> None:
        for session_id in list(self.sessions.sessions):
            self.close_session(session_id, reason)
