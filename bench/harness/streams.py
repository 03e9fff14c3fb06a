"""Token streams as a client sees them: tokens and messages per turn, for clients that read at
their own pace. The ``run_*`` functions run in a ``ClientProcess`` (module-level, picklable by
reference) against anything that serves ``SessionService`` (the gateway, or ``BareServer``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from bench.harness.workload import PROMPT
from router.client import AsyncSessionClient


@dataclass
class StreamRounds:
    """Rounds of one turn on every session at once: (tokens, messages, wall seconds) per round,
    and the token ids each turn of the last round delivered, in order. The first round warms up:
    rates leave it out, totals (what a CPU measurement around the whole run covers) do not."""

    rounds: list[tuple[int, int, float]] = field(default_factory=list)
    turns: list[list[int]] = field(default_factory=list)

    @property
    def measured(self) -> list[tuple[int, int, float]]:
        return self.rounds[1:] or self.rounds

    @property
    def rate(self) -> float:
        """Tokens per second over the measured rounds."""
        wall = sum(w for _, _, w in self.measured)
        return sum(t for t, _, _ in self.measured) / wall if wall else 0.0

    @property
    def step_s(self) -> float:
        """Seconds per token of one stream over the measured rounds (the engine's step)."""
        streams = len(self.turns) or 1
        return sum(w for _, _, w in self.measured) / (sum(t for t, _, _ in self.measured) / streams)

    @property
    def tokens_per_message(self) -> float:
        return sum(t for t, _, _ in self.measured) / sum(m for _, m, _ in self.measured)

    @property
    def tokens(self) -> int:
        """Tokens of every round, the first included."""
        return sum(t for t, _, _ in self.rounds)

    @property
    def messages(self) -> int:
        """Messages of every round, the first included."""
        return sum(m for _, m, _ in self.rounds)


async def _turn(
    client: AsyncSessionClient, session_id: str, new_tokens: int, read_every_s: float
) -> tuple[list[int], int]:
    """One turn, reading a message every ``read_every_s`` (0: as fast as they come)."""
    ids, messages = [], 0
    async for chunk in client.generate(session_id, tokens=PROMPT, max_new_tokens=new_tokens):
        ids.extend(chunk.token_ids)
        messages += 1
        if read_every_s:
            await asyncio.sleep(read_every_s)
    return ids, messages


async def run_stream_rounds(
    client: AsyncSessionClient, sessions: int, new_tokens: int, rounds: int, read_every_s: float
) -> StreamRounds:
    """``sessions`` sessions, ``rounds`` + 1 rounds of a turn on each at once (the sessions
    must hold ``rounds + 1`` turns: prompt and ``new_tokens`` each)."""
    opened = await asyncio.gather(*(client.open() for _ in range(sessions)))
    out = StreamRounds()
    try:
        for _ in range(rounds + 1):
            t0 = time.perf_counter()
            turns = await asyncio.gather(
                *(_turn(client, s.session_id, new_tokens, read_every_s) for s in opened)
            )
            wall = time.perf_counter() - t0
            out.rounds.append((sum(len(i) for i, _ in turns), sum(n for _, n in turns), wall))
            out.turns = [ids for ids, _ in turns]
    finally:
        await asyncio.gather(*(client.close_session(s.session_id) for s in opened))
    return out
