"""The replica's engine: continuous batching of session turns over one hybrid model.

Session-level operations (open, close, idle releases, checkpoint notes) are ``SessionOps``'s;
moving sessions between replicas is ``SessionMoves``'s. Single-threaded by contract: every
method runs on the thread that calls ``step`` (the async wrapper queues commands and applies
them between steps), so the pools change only between steps and every snapshot is consistent.
``step`` admits waiting turns, runs one forward for the decode batch and the prefill chunks,
samples, streams ``TurnEvent``s, and ends finished turns. When the engine goes idle it checks the
accounting invariant (strict mode raises).

How turns end is ``TurnOutputs``'s (closing a session during a turn cancels the turn). Errors
stay with the turns they touch; only an error outside any turn escapes ``step``, and then the
engine is dead: the replica reports itself dead and is replaced.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence

import torch

from replica.accounting import InvariantChecker, check_page_refs, count_pools
from replica.api import (
    CHECKPOINT_POOL,
    CheckpointStats,
    FinishReason,
    PoolSnapshot,
    PoolStats,
    SamplingParams,
    SessionMovingError,
    StatusCode,
    TurnEvent,
    TurnRunningError,
)
from replica.checkpoints.log import CheckpointLog
from replica.config import ReplicaConfig
from replica.engine.model_runner import ModelRunner
from replica.engine.moves import SessionMoves
from replica.engine.scheduler import Scheduler
from replica.engine.session_ops import SessionOps
from replica.engine.turn_check import check_turn
from replica.engine.turn_outputs import TurnOutputs
from replica.generation.defaults import GenerationDefaults
from replica.model import HybridModel, Tokenizer
from replica.model.fingerprint import model_fingerprint
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.pools.state_copy import StateCopier
from replica.sessions.parking import Parker
from replica.sessions.request import Req
from replica.sessions.session import StreamingSession
from replica.sessions.stream_leases import StreamLeases
from replica.sessions.transfer import StateTransfer

log = logging.getLogger(__name__)


class Engine(SessionOps):
    def __init__(
        self,
        config: ReplicaConfig,
        model: HybridModel,
        tokenizer: Tokenizer,
        replica_id: str = "replica-0",
        clock: Callable[[], float] = time.monotonic,
        generation: GenerationDefaults | None = None,
    ) -> None:
        """``clock`` is what idle timeouts and stream leases are measured by (tests pass
        their own); ``generation`` fills what a turn's sampling leaves unset and gives the
        model's EOS ids (none: the built-in defaults, no EOS)."""
        # KV "auto" is the weights' dtype: resolved here, where the model is known
        pools = config.pools.with_weights_dtype(model.embed_tokens.weight.dtype)
        config = dataclasses.replace(config, pools=pools)
        self.config = config
        self.generation = generation or GenerationDefaults()
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
            parker=Parker.build(self.pool, model.cfg, config.pools, config.failpoints),
        )
        self.scheduler = Scheduler(
            self.pool, self.sessions, config.max_prefill_chunk, config.max_batch_tokens
        )
        self.runner = ModelRunner(model, self.pool)
        self.checker = InvariantChecker(config.strict)
        self.leases = StreamLeases(self.sessions.clock)
        self.turns = TurnOutputs(tokenizer, self.scheduler, self.sessions)
        self.fingerprint = model_fingerprint(model.cfg, model)
        cuda = torch.device(config.pools.device).type == "cuda"
        self.transfer = StateTransfer(
            self.sessions, StateCopier(cuda), self.fingerprint, config.pools
        )
        self.moves = SessionMoves(
            self.sessions, self.scheduler, self.leases, self.transfer, self.snapshot, self.info
        )
        self.checkpoints: CheckpointLog | None = None
        if config.session_checkpoints:
            self.checkpoints = CheckpointLog(
                self.transfer, "leak_checkpoint_on_release" in config.failpoints
            )
            self.sessions.on_changed = self.checkpoints.changed
            self.sessions.on_released = self.checkpoints.released
        # the replica's checkpoint accounting (its store's acknowledgements): pool and totals
        # (until the actor connects its store: every checkpoint slot free, or no such pool)
        room = config.pools.max_open_sessions
        unstored = PoolStats(CHECKPOINT_POOL, room, room, 0, 0) if self.checkpoints else None
        self.checkpoint_accounting: Callable[[], tuple[PoolStats | None, CheckpointStats]] = (
            lambda: (unstored, CheckpointStats())
        )
        self.draining = False
        self._snapshot_seq = itertools.count(1)

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
        slot = self.sessions.get(session_id)
        context = slot.committed_tokens + len(input_ids)  # committed_tokens counts pending ones
        room = self.config.pools.max_context - context
        sampling = self.generation.apply(sampling or SamplingParams(), context, room)
        if slot.moving:
            raise SessionMovingError(
                f"session {session_id} is moving to another replica; ask the router where"
            )
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
            self.checkpoint_changed([slot])
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
        checkpoint_pool, checkpoints = self.checkpoint_accounting()
        pools = count_pools(self.pool, self.sessions, self.scheduler.running)
        return PoolSnapshot(
            replica_id=self.replica_id,
            incarnation=self.incarnation,
            pools=pools if checkpoint_pool is None else (*pools, checkpoint_pool),
            open_sessions=len(self.sessions),
            running_requests=len(self.scheduler.running),
            waiting_requests=len(self.scheduler.waiting),
            taken_at=time.time(),
            seq=next(self._snapshot_seq),
            draining=self.draining,
            sessions_opened_total=self.sessions.opened_total,
            sessions_released_total=dict(self.sessions.released_total),
            parking=self.sessions.residency.stats(),
            checkpoints=checkpoints,
            state_cache=self.sessions.cache.stats(),
        )

    def check_invariant(self) -> PoolSnapshot:
        """Snapshot and check it (strict mode raises ``LeakError``); also the free lists."""
        snap = self.snapshot()
        page_refs = None
        if self.pool.kv_pool.page_allocator.shared_refs:  # O(pages): only when pages are shared
            page_refs = check_page_refs(self.pool, self.sessions, self.scheduler.running)
        self.checker.check(snap, page_refs)
        self.pool.check_integrity()
        return snap
