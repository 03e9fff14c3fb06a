"""What a replica's checkpoint stream carries: each item is a list of entries, in order, each a
``SessionStates`` record (one session's latest state), a ``CheckpointDrop`` (sessions released:
free their checkpoints) or a ``CheckpointBlank`` (sessions that hold nothing yet: a failover
opens them again empty); ``next_entries`` makes the next item of a queue of them.

Nothing waits for a drop or a blank (a stream item of its own for each would cost the store and
the replica an item per session), so alone they wait up to ``DROP_DELAY_S`` for a record to
travel with. Torch-free: the store reads these.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from replica.api import SessionStates

DROP_DELAY_S = 0.25  # the longest drops and blanks wait for a record to travel with


@dataclass(frozen=True, slots=True)
class CheckpointDrop:
    """A stream entry: free these sessions' checkpoints (they were released)."""

    session_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CheckpointBlank:
    """A stream entry: these sessions hold nothing yet (session id, tenant, idle timeout)."""

    sessions: tuple[tuple[str, str, float], ...]


CheckpointEntry = SessionStates | CheckpointDrop | CheckpointBlank


async def next_entries(queue: asyncio.Queue) -> list:
    """The entries of the next stream item from ``queue`` (of ``(number, entry)``, ``None`` at
    the stream's end): every one queued (waiting for one), except that drops and blanks alone
    wait up to ``DROP_DELAY_S`` for a record or the end. Entries keep their order and numbers,
    so the accounting of each acknowledgement holds."""
    entries = [await queue.get()]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DROP_DELAY_S
    while True:
        while not queue.empty():
            entries.append(queue.get_nowait())
        if any(e is None or isinstance(e[1], SessionStates) for e in entries):
            return entries
        try:
            entries.append(await asyncio.wait_for(queue.get(), deadline - loop.time()))
        except asyncio.TimeoutError:
            return entries
