"""The session workloads the drivers run, and their records.

A lifecycle is OpenSession, one turn of ``PROMPT`` plus ``new_tokens`` greedy tokens, and
CloseSession. Token rounds keep ``sessions`` sessions open and run one turn on each at once, per
round; the first round of a run warms up and is not counted in its rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

PROMPT = (72, 101, 108, 108, 111, 44, 32, 119)  # 8 tokens ("Hello, w" in the byte tokenizer)


class Lifecycle(NamedTuple):
    """``time.perf_counter()`` at each phase boundary of one lifecycle, and its tokens."""

    start: float
    opened: float
    turn_done: float
    closed: float
    tokens: int


@dataclass
class TokenRounds:
    """Rounds of turns on concurrent sessions: (tokens delivered, wall seconds) per round."""

    rounds: list[tuple[int, float]] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)  # where the sessions ran, when known

    @property
    def measured(self) -> list[tuple[int, float]]:
        """The rounds that count: all but the first, unless there is only one."""
        return self.rounds[1:] or self.rounds

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.rounds)

    @property
    def rate(self) -> float:
        """Tokens per second over the measured rounds."""
        return sum(n for n, _ in self.measured) / sum(s for _, s in self.measured)
