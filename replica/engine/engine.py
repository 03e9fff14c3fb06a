"""The replica's engine: continuous batching of session turns over one hybrid model.

The engine builds its parts and delegates to them: queueing, interrupting and cancelling turns
is ``TurnOps``'s, session-level operations (open, close, idle releases, checkpoint notes)
``SessionOps``'s, moving sessions between replicas ``SessionMoves``'s. Single-threaded by
contract: every method runs on the thread that calls ``step`` (the async wrapper queues commands
and applies them between steps), so the pools change only between steps and every snapshot is
consistent. ``step`` admits waiting turns, runs one forward for the decode batch and the prefill
chunks, samples, streams what the turns produced (one ``StepOutputs`` a step), and ends finished
turns. When the engine goes idle it checks the accounting invariant (strict mode raises).

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
from replica.api import PoolSnapshot, ReleaseReason, SamplingParams, SessionInfo
from replica.checkpoints.log import CheckpointLog
from replica.config import ReplicaConfig
from replica.engine.checkpoint_accounting import CheckpointAccounting
from replica.engine.model_runner import ModelRunner
from replica.engine.moves import SessionMoves
from replica.engine.scheduler import Scheduler
from replica.engine.session_ops import SessionOps
from replica.engine.step_outputs import StepOutputs
from replica.engine.turn_ops import TurnOps
from replica.engine.turn_outputs import TurnOutputs
from replica.generation.defaults import GenerationDefaults
from replica.model import HybridModel, Tokenizer
from replica.model.fingerprint import model_fingerprint
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.pools.state_copy import StateCopier
from replica.sessions.parking import Parker
from replica.sessions.request import Req
from replica.sessions.stream_leases import StreamLeases
from replica.sessions.table import SessionTable
from replica.sessions.transfer import StateTransfer

log = logging.getLogger(__name__)


class Engine:
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
        self.checkpoints: CheckpointLog | None = None
        if config.session_checkpoints:
            self.checkpoints = CheckpointLog("leak_checkpoint_on_release" in config.failpoints)
        log = self.checkpoints
        self.sessions = SessionTable(
            self.pool,
            config.session_idle_timeout_s,
            clock=clock,
            failpoints=config.failpoints,
            parker=Parker.build(self.pool, model.cfg, config.pools, config.failpoints),
            on_changed=None if log is None else log.changed,
            on_released=None if log is None else log.released,
        )
        self.scheduler = Scheduler(
            self.pool, self.sessions, config.max_prefill_chunk, config.max_batch_tokens
        )
        self.runner = ModelRunner(model, self.pool, config.cuda_graphs, config.pad_decode)
        self.checker = InvariantChecker(config.strict)
        self.leases = StreamLeases(self.sessions.clock)
        self.turns = TurnOutputs(tokenizer, self.scheduler, self.sessions, model.cfg.vocab_size)
        self.fingerprint = model_fingerprint(model.cfg, model)
        cuda = torch.device(config.pools.device).type == "cuda"
        self.transfer = StateTransfer(
            self.sessions, StateCopier(cuda), self.fingerprint, config.pools
        )
        self.turn_ops = TurnOps(
            config,
            self.generation,
            model.cfg.vocab_size,
            self.sessions,
            self.scheduler,
            self.turns,
            self.checkpoints,
        )
        self.session_ops = SessionOps(
            config,
            model.cfg.vocab_size,
            replica_id,
            self.sessions,
            self.scheduler,
            self.leases,
            self.checkpoints,
            self.transfer,
            self.turn_ops.cancel,
        )
        self.moves = SessionMoves(
            self.sessions,
            self.scheduler,
            self.leases,
            self.transfer,
            self.snapshot,
            self.session_ops.info,
        )
        self.checkpoint_accounting = CheckpointAccounting(
            config.pools.max_open_sessions, self.checkpoints, self.sessions
        )
        self._snapshot_seq = itertools.count(1)

    # ----- turns ----------------------------------------------------------------------------

    def submit(
        self,
        session_id: str,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        gateway_id: str | None = None,
        names_state: bool = False,
    ) -> Req:
        """``TurnOps.submit``: queue a turn (raises a typed ``ReplicaError``)."""
        return self.turn_ops.submit(session_id, input_ids, sampling, gateway_id, names_state)

    def continues(self, session_id: str, committed_tokens: int) -> bool:
        """Whether the session holds ``committed_tokens`` tokens (True for one not open here:
        its turn is refused as such)."""
        slot = self.sessions.sessions.get(session_id)
        return slot is None or slot.committed_tokens == committed_tokens

    def interrupt(self, session_id: str) -> bool:
        """``TurnOps.interrupt``: barge-in."""
        return self.turn_ops.interrupt(session_id)

    def cancel(
        self, session_id: str, why: str = "turn cancelled", turn_id: int | None = None
    ) -> bool:
        """``TurnOps.cancel``: end the session's turn and roll it back."""
        return self.turn_ops.cancel(session_id, why, turn_id)

    # ----- sessions -------------------------------------------------------------------------

    def open_session(
        self,
        session_id: str,
        idle_timeout_s: float = 0.0,
        tenant: str = "",
        gateway_id: str = "",
        prefix_ids: Sequence[int] | None = None,
    ) -> SessionInfo:
        """``SessionOps.open_session``."""
        return self.session_ops.open_session(
            session_id, idle_timeout_s, tenant, gateway_id, prefix_ids
        )

    def fork_session(self, parent_id: str, child_id: str, gateway_id: str = "") -> SessionInfo:
        """``SessionOps.fork_session``."""
        return self.session_ops.fork_session(parent_id, child_id, gateway_id)

    def close_session(
        self, session_id: str, reason: ReleaseReason = ReleaseReason.CLOSED, force: bool = False
    ) -> bool:
        """``SessionOps.close_session`` (idempotent)."""
        return self.session_ops.close_session(session_id, reason, force)

    def session_info(self, session_id: str) -> SessionInfo:
        return self.session_ops.session_info(session_id)

    def release_idle(self) -> list[str]:
        """Drop stale moving marks (``SessionMoves.expire``), then release the sessions idle
        past their timeout (``SessionOps.release_idle``); returns their ids."""
        self.moves.expire()
        return self.session_ops.release_idle()

    # ----- the step -------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> StepOutputs:
        """Run one engine step; returns what it (and commands since the last) produced."""
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

    def take_events(self) -> StepOutputs:
        return self.turns.take()

    # ----- accounting -----------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        checkpoint_pool, checkpoints = self.checkpoint_accounting.read()
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
            draining=self.session_ops.draining,
            sessions_opened_total=self.sessions.opened_total,
            sessions_released_total=dict(self.sessions.released_total),
            parking=self.sessions.residency.stats(),
            checkpoints=checkpoints,
            state_cache=self.sessions.cache.stats(),
            steps=self.runner.step_stats(),
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
