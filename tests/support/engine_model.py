"""The engine state machine's own model of a replica's sessions and turns.

It records what the test did and what the engine reported, and decides from the documented
rules alone: whether a submitted turn must be refused (and with which error), which waiting turns
the next step admits (first come, first served, each reserving the KV pages of its whole turn;
a turn that cannot fit while nothing runs is refused), how each turn's end must look
(``tests/support/model_turns.py``), which sessions the idle timeout must release, and from its
own count of each session's KV positions what every pool must show.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from replica.api import (
    ContextOverflowError,
    FinishReason,
    InvalidRequestError,
    PoolStats,
    ReleaseReason,
    ReplicaError,
    SamplingParams,
    SessionNotFoundError,
    StatusCode,
    TurnEvent,
    TurnRunningError,
)
from replica.engine.engine import Engine
from replica.sessions.request import Req
from tests.support.model_turns import ModelSession, check_final, outcome
from tests.support.pool_oracle import Capacity


class EngineModel:
    def __init__(self, cap: Capacity, max_context: int, vocab: int, default_timeout_s: float):
        self.cap = cap
        self.max_context = max_context
        self.vocab = vocab
        self.default_timeout_s = default_timeout_s
        self.sessions: dict[str, ModelSession] = {}
        self.waiting: list[str] = []  # sessions whose turn waits, in submission order
        self.opened = 0
        self.released: Counter[str] = Counter()

    # ----- sessions opened and released -----------------------------------------------------------

    def add(self, sid: str, timeout_s: float, now: float) -> None:
        self.sessions[sid] = ModelSession(timeout_s, now)
        self.opened += 1

    def release(self, sid: str, reason: ReleaseReason) -> None:
        del self.sessions[sid]
        self.released[reason.value] += 1

    def with_turn(self, in_flight: bool) -> list[str]:
        return sorted(sid for sid, s in self.sessions.items() if bool(s.turn) == in_flight)

    # ----- what the engine must do ---------------------------------------------------------------

    def timeout_for(self, asked_s: float) -> float:
        """A session's idle timeout: what it asked for, capped by the replica's."""
        return min(asked_s, self.default_timeout_s) if asked_s > 0 else self.default_timeout_s

    def refusal(self, sid: str, ids: list[int], sampling: SamplingParams) -> type | None:
        """The error ``submit`` must raise, or None when it must accept the turn."""
        s = self.sessions.get(sid)
        if s is None:
            return SessionNotFoundError
        if s.turn is not None:
            return TurnRunningError
        if any(not 0 <= t < self.vocab for t in ids):
            return InvalidRequestError
        if not ids and not s.pending and sampling.max_new_tokens > 0:
            return InvalidRequestError
        if s.committed + len(ids) + sampling.max_new_tokens > self.max_context:
            return ContextOverflowError
        return None

    def expired(self, now: float) -> set[str]:
        """Sessions the idle timeout must release: no turn in flight, idle past their timeout."""
        return {
            sid
            for sid, s in self.sessions.items()
            if s.turn is None and now - s.last_active > s.timeout_s
        }

    def expected_pools(self) -> dict[str, PoolStats]:
        running = self.running()
        resting = [s for s in self.sessions.values() if s not in running]
        return self.cap.expect(
            idle=len(resting),
            running=len(running),
            idle_pages=sum(self.cap.pages(s.positions) for s in resting),
            running_pages=sum(self.cap.pages(s.turn.reservation) for s in running),
        )

    def running(self) -> list[ModelSession]:
        return [s for s in self.sessions.values() if s.turn and s.turn.admitted]

    def free_pages(self) -> int:
        held = sum(
            self.cap.pages(s.turn.reservation if s.turn and s.turn.admitted else s.positions)
            for s in self.sessions.values()
        )
        return self.cap.kv_pages - held

    def admit(self) -> set[int]:
        """Admit waiting turns as the next step must; returns the turn ids it must refuse."""
        refused: set[int] = set()
        while self.waiting:
            s = self.sessions[self.waiting[0]]
            turn = s.turn
            target = s.committed + len(turn.input_ids) + max(0, turn.sampling.max_new_tokens - 1)
            if self.cap.pages(target) - self.cap.pages(s.positions) > self.free_pages():
                if self.running():
                    break
                self.waiting.pop(0)
                refused.add(turn.rid)
                continue
            self.waiting.pop(0)
            turn.admitted, turn.reservation = True, target
        return refused

    # ----- what the engine reported --------------------------------------------------------------

    def turn_of(self, event: TurnEvent) -> tuple[str, ModelSession]:
        s = self.sessions.get(event.session_id)
        assert s is not None and s.turn is not None and s.turn.rid == event.turn_id, (
            f"event of a turn not in flight: {event}"
        )
        return event.session_id, s

    def end_turn(
        self, sid: str, s: ModelSession, committed: int, pending: tuple[int, ...], now: float
    ) -> None:
        """The turn is over; an admitted turn's end counts as activity (as do the session's
        open and every turn submitted on it)."""
        if s.turn.admitted:
            s.last_active = now
        elif sid in self.waiting:  # a refused turn has left the queue already
            self.waiting.remove(sid)
        s.committed, s.pending, s.turn = committed, pending, None

    def apply(
        self,
        events: list[TurnEvent],
        ends: dict[int, FinishReason | StatusCode],
        pending_of: Callable[[str], tuple[int, ...] | None],
        now: float,
    ) -> None:
        """Apply the engine's events. ``ends`` says how turns the test ended (interrupt, cancel,
        refusal) must end; the others end by a stop token or by length. ``pending_of(sid)``
        reads back a session's pending tokens (None once it is closed)."""
        ends = dict(ends)
        for event in events:
            sid, s = self.turn_of(event)
            turn = s.turn
            turn.tokens.extend(event.token_ids)
            if not event.finished:
                assert turn.admitted, f"tokens from a turn not admitted: {event}"
                continue
            how = ends.pop(event.turn_id, None)
            if how is None:
                stopped = turn.tokens and turn.tokens[-1] in turn.sampling.stop_token_ids
                how = FinishReason.STOP if stopped else FinishReason.LENGTH
            check_final(event, s, how)
            committed, pending = outcome(s, event, how, pending_of(sid), self.cap.track > 0)
            self.end_turn(sid, s, committed, pending, now)
        assert not ends, f"turns that did not end as they must: {ends}"


def submit_checked(
    engine: Engine, model: EngineModel, sid: str, ids: list[int], sampling: SamplingParams
) -> Req | None:
    """Submit a turn; it must be refused exactly when (and as) the model says. The request, if
    accepted."""
    error, refused, req = model.refusal(sid, ids, sampling), None, None
    try:
        req = engine.submit(sid, ids, sampling)
    except ReplicaError as exc:
        refused = exc
    if error is None:
        assert refused is None, f"submit refused a turn that must be accepted: {refused!r}"
    else:
        assert type(refused) is error, f"submit must raise {error.__name__}, got {refused!r}"
    return req
