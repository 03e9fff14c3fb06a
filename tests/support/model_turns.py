"""The engine state machine's records of sessions and turns, and how a turn's end must look.

A turn's final event must say how it ended (stop token, length, interrupt, cancel, refusal) with
the tokens and committed count that follow from what the test sent and what was streamed, and
leave the session's pending tokens (produced, not yet folded in) where the documented rules put
them: a finished turn leaves its last token; a rolled-back one leaves what it found; one ended in
prefill leaves the unfolded tail of its input, which only the engine knows (it depends on
chunking), so that one is read back and checked to be such a tail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replica.api import FinishReason, SamplingParams, StatusCode, TurnEvent


@dataclass
class ModelTurn:
    rid: int
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    admitted: bool = False
    reservation: int = 0  # KV positions reserved for the whole turn, once admitted
    tokens: list[int] = field(default_factory=list)  # streamed so far


@dataclass
class ModelSession:
    timeout_s: float
    last_active: float
    committed: int = 0  # committed tokens: folded in plus pending
    pending: tuple[int, ...] = ()  # produced but not folded in yet (fed first next turn)
    turn: ModelTurn | None = None

    @property
    def positions(self) -> int:
        """KV positions its state covers between turns."""
        return self.committed - len(self.pending)


def outcome(
    s: ModelSession,
    event: TurnEvent,
    how: FinishReason | StatusCode,
    observed: tuple[int, ...] | None,
    rolls_back: bool,
) -> tuple[int, tuple[int, ...]]:
    """Where the session stands after its turn ended ``how``: committed and pending tokens.
    ``rolls_back``: a cancelled turn returns to its turn snapshot (track buffers >= 1)."""
    turn = s.turn
    kept = s.committed + len(turn.input_ids) + len(turn.tokens)
    if not turn.admitted and how == FinishReason.INTERRUPTED:  # its input is kept
        committed, pending = kept, (*s.pending, *turn.input_ids)
        assert event.committed_tokens == committed, event
    elif not turn.admitted or (how == StatusCode.CANCELLED and rolls_back):
        committed, pending = s.committed, s.pending  # untouched, or rolled back
    elif how in (FinishReason.LENGTH, FinishReason.STOP):
        committed, pending = kept, tuple(turn.tokens[-1:])
    else:  # interrupted while running, or cancelled with nothing to roll back to
        assert event.committed_tokens == kept, event
        closed = observed is None
        committed, pending = kept, () if closed else unfolded_tail(s, observed)
    if observed is not None:
        assert observed == pending, f"pending {observed}, the model says {pending}"
    return committed, pending


def check_final(event: TurnEvent, s: ModelSession, expected: FinishReason | StatusCode) -> None:
    """``event`` ends ``s``'s turn as ``expected`` says; checks its tokens and counts."""
    turn = s.turn
    got = event.error_code if event.error_code is not None else event.finish_reason
    assert got == expected, f"turn ended {got}, expected {expected}: {event}"
    stops = set(turn.sampling.stop_token_ids)
    if expected == FinishReason.LENGTH:
        assert len(turn.tokens) == turn.sampling.max_new_tokens, event
        assert not stops & set(turn.tokens), event
    elif expected == FinishReason.STOP:
        assert turn.tokens and turn.tokens[-1] in stops, event
        assert not stops & set(turn.tokens[:-1]), event
        assert len(turn.tokens) <= turn.sampling.max_new_tokens
    if isinstance(expected, FinishReason) and turn.admitted:
        assert event.committed_tokens == s.committed + len(turn.input_ids) + len(turn.tokens)


def unfolded_tail(s: ModelSession, observed: tuple[int, ...]) -> tuple[int, ...]:
    """A turn that ended (kept) after admission: what it leaves pending. With tokens
    streamed, the last one; else (ended in prefill) the unfolded tail of its input, read
    back from the engine and checked to be that tail."""
    turn = s.turn
    if turn.tokens:
        return (turn.tokens[-1],)
    fed = (*s.pending, *turn.input_ids)
    assert 1 <= len(observed) <= len(fed) and fed[-len(observed) :] == observed, (
        f"pending {observed} is not an unfolded tail of the turn's input {fed}"
    )
    return observed
