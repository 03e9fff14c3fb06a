"""The session workloads the drivers run, and their records.

A lifecycle is OpenSession, one turn of ``PROMPT`` plus ``new_tokens`` greedy tokens, and
CloseSession. Token rounds keep ``sessions`` sessions open and run one turn on each at once, per
round; the first round of a run warms up and is not counted in its rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
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


async def timed_lifecycle(
    open_session: Callable[[], Awaitable[str]],
    turn: Callable[[str], Awaitable[int]],
    close: Callable[[str], Awaitable[object]],
) -> Lifecycle:
    """One lifecycle on any path: ``open_session()`` gives a session id, ``turn(id)`` runs the
    turn and gives its token count, ``close(id)`` runs whatever happened to the turn."""
    t0 = time.perf_counter()
    session_id = await open_session()
    t1 = time.perf_counter()
    try:
        tokens = await turn(session_id)
    finally:
        t2 = time.perf_counter()
        await close(session_id)
    return Lifecycle(t0, t1, t2, time.perf_counter(), tokens)


async def token_rounds(
    open_session: Callable[[], Awaitable[str]],
    turn: Callable[[str], Awaitable[int]],
    close: Callable[[str], Awaitable[object]],
    sessions: int,
    rounds: int,
) -> TokenRounds:
    """``sessions`` sessions open at once, ``rounds`` rounds of a turn on each at once; every
    session is closed at the end."""
    ids = await asyncio.gather(*(open_session() for _ in range(sessions)))
    result = TokenRounds()
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            counts = await asyncio.gather(*(turn(s) for s in ids))
            result.rounds.append((sum(counts), time.perf_counter() - t0))
    finally:
        await asyncio.gather(*(close(s) for s in ids))
    return result
