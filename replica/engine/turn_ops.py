"""``TurnOps``: how a session's turn is queued, interrupted and cancelled on the engine.

The engine builds it over the parts it owns (the session table, the scheduler, the turns'
outputs, the checkpoint log) and delegates to it; a close (``SessionOps``) cancels a session's
turn through it. Its methods run on the engine thread, between steps, like every engine method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from replica.api import (
    FinishReason,
    SamplingParams,
    SessionMovingError,
    StatusCode,
    TurnRunningError,
)
from replica.config import ReplicaConfig
from replica.engine.turn_check import check_turn
from replica.generation.defaults import GenerationDefaults
from replica.sessions.request import Req

if TYPE_CHECKING:
    from replica.checkpoints.log import CheckpointLog
    from replica.engine.scheduler import Scheduler
    from replica.engine.turn_outputs import TurnOutputs
    from replica.sessions.table import SessionTable


class TurnOps:
    def __init__(
        self,
        config: ReplicaConfig,
        generation: GenerationDefaults,
        vocab_size: int,
        sessions: SessionTable,
        scheduler: Scheduler,
        turns: TurnOutputs,
        checkpoints: CheckpointLog | None,
    ) -> None:
        """``generation`` fills what a turn's sampling leaves unset; ``checkpoints`` None:
        checkpoints are off."""
        self.config = config
        self.generation = generation
        self.vocab_size = vocab_size
        self.sessions = sessions
        self.scheduler = scheduler
        self.turns = turns
        self.checkpoints = checkpoints

    def submit(
        self,
        session_id: str,
        input_ids: Sequence[int],
        sampling: SamplingParams | None = None,
        gateway_id: str | None = None,
        names_state: bool = False,
    ) -> Req:
        """Queue a turn; its events go to ``gateway_id`` (from now on, the session's gateway).
        ``names_state``: its caller checked the state it continues, and checks the next turn's
        the same way, so the turn's end need not wait for its checkpoint. Validates everything
        up front; raises a typed ``ReplicaError``."""
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
        check_turn(slot, input_ids, sampling, self.vocab_size, self.config.pools.max_context)
        if gateway_id is not None:
            slot.gateway_id = gateway_id
        slot.names_state = names_state
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
            if self.checkpoints is not None:
                self.checkpoints.changed([slot])
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
