"""Validation of a turn before it is queued: every refusal is a typed error with a message that
says what to do, raised before the turn takes anything."""

from __future__ import annotations

from collections.abc import Sequence

from replica.api import ContextOverflowError, InvalidRequestError, SamplingParams
from replica.sessions.table import SessionRecord


def check_turn(
    slot: SessionRecord,
    input_ids: Sequence[int],
    sampling: SamplingParams,
    vocab: int,
    max_context: int,
) -> None:
    """Raises ``InvalidRequestError`` (token ids outside the vocabulary, nothing to generate
    from) or ``ContextOverflowError`` (the turn would not fit the session's context)."""
    bad = [t for t in input_ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"token ids {bad[:8]} are outside the vocabulary 0..{vocab - 1}")
    if not input_ids and not slot.pending_ids and sampling.max_new_tokens > 0:
        raise InvalidRequestError("empty input: give text or tokens to generate from")
    bad_stop = [t for t in sampling.stop_token_ids if not 0 <= t < vocab]
    if bad_stop:
        raise InvalidRequestError(f"stop token ids {bad_stop[:8]} are outside the vocabulary")
    total = slot.committed_tokens + len(input_ids) + sampling.max_new_tokens
    if total > max_context:
        raise ContextOverflowError(
            f"turn would exceed the context: {slot.committed_tokens} committed + "
            f"{len(input_ids)} input + {sampling.max_new_tokens} new tokens > {max_context}; "
            "shorten the input, lower max_new_tokens or open a new session"
        )
