"""``StepOutputs``: what the engine produced in one step (and the commands since the last), as one
record whatever the batch size.

The tokens of turns that go on are rows of parallel lists (``session_ids``, ``turn_ids``,
``gateway_ids``, ``token_ids``, ``texts``: one token and its text per row, one row per turn a
step); everything else is a ``TurnEvent`` in ``events``: the last event of a turn (finish or
error), an event about a session, a token held back and sent on later. ``events`` come before the
rows: a session's turn that ended before the step is in ``events``, and its next turn's token is a
row (a turn either streams a row or ends in a step, never both). Iterating a record gives those
``TurnEvent``s in that order, one per row too: for tests and tools; the replica's output streams
carry the rows as they are (``replica.api.TokenRows``). A record taken from the engine is not
changed by it again; whoever dispatches it may consume it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from replica.api import TurnEvent


@dataclass(slots=True)
class StepOutputs:
    events: list[TurnEvent] = field(default_factory=list)
    session_ids: list[str] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    gateway_ids: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def add_rows(
        self,
        session_ids: list[str],
        turn_ids: list[int],
        gateway_ids: list[str],
        token_ids: list[int],
        texts: list[str],
    ) -> None:
        """One token for each of a batch's turns (lists of one length; copied)."""
        self.session_ids += session_ids
        self.turn_ids += turn_ids
        self.gateway_ids += gateway_ids
        self.token_ids += token_ids
        self.texts += texts

    @property
    def token_count(self) -> int:
        """The tokens in the record: one a row, and those of its events."""
        return len(self.token_ids) + sum(len(event.token_ids) for event in self.events)

    def row_event(self, i: int) -> TurnEvent:
        """Row ``i`` as the ``TurnEvent`` of one token."""
        return TurnEvent(
            self.session_ids[i],
            self.turn_ids[i],
            (self.token_ids[i],),
            self.texts[i],
            gateway_id=self.gateway_ids[i],
        )

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only the rows at ``rows`` (ascending), dropping the others."""
        self.session_ids = [self.session_ids[i] for i in rows]
        self.turn_ids = [self.turn_ids[i] for i in rows]
        self.gateway_ids = [self.gateway_ids[i] for i in rows]
        self.token_ids = [self.token_ids[i] for i in rows]
        self.texts = [self.texts[i] for i in rows]

    def __iter__(self) -> Iterator[TurnEvent]:
        yield from self.events
        for i in range(len(self.session_ids)):
            yield self.row_event(i)

    def __len__(self) -> int:
        return len(self.events) + len(self.session_ids)

    def __add__(self, other: Iterable[TurnEvent]) -> list[TurnEvent]:
        return [*self, *other]

    def __radd__(self, other: Iterable[TurnEvent]) -> list[TurnEvent]:
        return [*other, *self]
