"""``CheckpointOutbox``: a replica's checkpoints on their way to its ``CheckpointStore``, and the
turn endings that wait for them.

The store pulls: it holds one long-lived streaming call, ``ReplicaActor.checkpoint_stream``,
whose items are this outbox's, in order: a ``SessionStates`` record (one session's latest state)
or a ``CheckpointDrop`` (sessions released: free their checkpoints). Each item is an object the
*store* owns (Ray makes the caller of a streaming call the owner of its items), kept in the
object store of this replica's node: the bytes are copied once, into the object store, and
outlive this replica's process. The store acknowledges items by their sequence number
(``acked``); the first item is 1.

A turn's last event is held back until the checkpoint of that turn's end is acknowledged, so a
client that saw a turn end will find its session at that turn's committed tokens after a
failover; the session's later events queue behind it, in order, and every other session's
events go out at once. If the store stops acknowledging for ``stall_s`` (it died), holds are
released, checkpointing stops (the queue is dropped) and a log line says so; a store that
connects again starts over. Without a connected store nothing is queued or held.

Accounting, exact at each acknowledgement: ``expected`` is how many sessions of this replica
must have a checkpoint once every item sent so far is applied; the store's acknowledgement says
how many it holds after the same item. The ``checkpoints`` pool: capacity = sessions the replica
can hold, ``session_held`` = expected, ``free`` = capacity - held by the store, so ``leaked`` =
store's count - expected: a checkpoint the store keeps for a released session shows.
Used on the actor's event loop only (``pool_stats`` may be read from the engine thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from replica.api import CHECKPOINT_POOL, CheckpointStats, PoolStats, SessionStates, TurnEvent
from replica.checkpoints.log import CheckpointBatch

log = logging.getLogger(__name__)

STALL_S = 10.0  # a store that acknowledges nothing for this long is gone


@dataclass(frozen=True, slots=True)
class CheckpointDrop:
    """A stream item: free these sessions' checkpoints (they were released)."""

    session_ids: tuple[str, ...]


class CheckpointOutbox:
    def __init__(
        self,
        dispatch: Callable[[list[TurnEvent]], None],
        capacity: int,
        on_connected: Callable[[bool], None] = lambda connected: None,
        stall_s: float = STALL_S,
    ) -> None:
        self.send_events = dispatch
        self.on_connected = on_connected
        self.capacity = capacity
        self.stall_s = stall_s
        self.connected = False
        self._queue: asyncio.Queue = asyncio.Queue()
        self._seq = 0  # items queued so far
        self._sent_at: dict[int, float] = {}  # unacknowledged items: when queued
        self._expected: set[str] = set()
        self._expected_after: dict[int, int] = {}  # item seq -> len(expected) after it
        self._unfreed = 0  # sessions released without their checkpoint freed, so far
        self._unfreed_at: dict[int, int] = {}  # item seq -> ``_unfreed`` when it was queued
        self._waiting: dict[str, int] = {}  # session id -> seq of its unacknowledged save
        self._held: dict[str, list[TurnEvent]] = {}
        self._durable: list[tuple[set[str], asyncio.Future]] = []  # ``durable`` callers
        self._acked = (0, 0, 0)  # (store held, expected, store bytes) at the last ack
        self.written_total = 0
        self.bytes_written_total = 0

    # ----- the engine's output ----------------------------------------------------------------

    def push(self, batch: CheckpointBatch) -> None:
        """Queue one engine step's checkpoints (before that step's events are dispatched)."""
        if not self.connected:
            return
        dropped = set(batch.dropped)
        unfreed = [s for s in batch.released if s in self._expected and s not in dropped]
        self._expected.difference_update(batch.released)
        if unfreed:  # released, their checkpoints not freed (a failpoint): leaked from now on
            self._unfreed += len(unfreed)
            store_held, expected, store_bytes = self._acked
            self._acked = (store_held, expected - len(unfreed), store_bytes)
        if batch.dropped:
            self._put(CheckpointDrop(tuple(batch.dropped)))
        for record in batch.saved:
            session_id = record.sessions[0].session_id
            self._expected.add(session_id)
            self._waiting[session_id] = self._put(record)
            self.written_total += 1
            self.bytes_written_total += record.nbytes

    def _put(self, item: SessionStates | CheckpointDrop) -> int:
        self._seq += 1
        self._sent_at[self._seq] = time.monotonic()
        self._expected_after[self._seq] = len(self._expected)
        self._unfreed_at[self._seq] = self._unfreed
        self._queue.put_nowait(item)
        return self._seq

    def dispatch(self, events: list[TurnEvent]) -> None:
        """Send events on, except those of sessions whose checkpoint is on its way."""
        now = []
        for event in events:
            if event.session_id in self._waiting or event.session_id in self._held:
                self._held.setdefault(event.session_id, []).append(event)
            else:
                now.append(event)
        if now:
            self.send_events(now)
        self._check_stall()

    # ----- the store's side -------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[SessionStates | CheckpointDrop]:
        """The items, forever, for the one store that follows this replica."""
        self._reset()
        self._connect(True)
        try:
            while (item := await self._queue.get()) is not None:
                yield item
        finally:
            self._connect(False)
            self._reset()

    def _connect(self, connected: bool) -> None:
        self.connected = connected
        self.on_connected(connected)

    def close(self) -> None:
        """The replica is dead: end the stream (the store keeps what it has)."""
        self._connect(False)
        self._queue.put_nowait(None)

    def acked(self, seq: int, store_held: int, store_bytes: int) -> None:
        """The store holds every item up to ``seq``, and ``store_held`` checkpoints now."""
        expected = self._expected_after.get(seq, len(self._expected))
        expected -= self._unfreed - self._unfreed_at.get(seq, self._unfreed)  # leaked since
        self._acked = (store_held, expected, store_bytes)
        for done in [s for s in self._sent_at if s <= seq]:
            del self._sent_at[done]
        for done in [s for s in self._expected_after if s < seq]:
            del self._expected_after[done]
            self._unfreed_at.pop(done, None)
        stored = [sid for sid, s in self._waiting.items() if s <= seq]
        for session_id in stored:
            del self._waiting[session_id]
            self._release(session_id)
        for waiting, done in self._durable:
            waiting.difference_update(stored)
            if not waiting and not done.done():
                done.set_result(True)
        self._durable = [(w, f) for w, f in self._durable if not f.done()]

    async def durable(self, session_ids: list[str]) -> bool:
        """Wait until a checkpoint of each of ``session_ids`` taken from now on is stored (a
        session that arrived by migration is safe from its new replica's death from then on);
        False when that did not happen within ``stall_s`` or no store is connected."""
        if not self.connected or not session_ids:
            return False
        done = asyncio.get_running_loop().create_future()
        self._durable.append((set(session_ids), done))
        try:
            return await asyncio.wait_for(done, self.stall_s)
        except asyncio.TimeoutError:
            return False

    def _release(self, session_id: str) -> None:
        if session_id not in self._waiting:
            held = self._held.pop(session_id, None)
            if held:
                self.send_events(held)

    def _check_stall(self) -> None:
        oldest = min(self._sent_at.values(), default=None)
        if oldest is not None and time.monotonic() - oldest > self.stall_s:
            log.error(
                "the checkpoint store acknowledged nothing for %.0f s: checkpoints stop until "
                "it reconnects (sessions of this replica would not survive its death)",
                self.stall_s,
            )
            self._connect(False)
            self._reset()

    def _reset(self) -> None:
        """Forget everything in flight and send every held event on."""
        self._queue = asyncio.Queue()
        self._seq = 0
        self._sent_at.clear()
        self._expected_after.clear()
        self._unfreed_at.clear()
        self._expected.clear()
        self._waiting.clear()
        self._acked = (0, 0, 0)
        for session_id in list(self._held):
            self._release(session_id)
        for _, done in self._durable:
            if not done.done():
                done.set_result(False)
        self._durable = []

    # ----- accounting -------------------------------------------------------------------------

    def pool_stats(self) -> PoolStats:
        """The ``checkpoints`` pool as of the last acknowledgement (all free while no store is
        connected: none holds a checkpoint of this replica then)."""
        store_held, expected, _ = self._acked
        return PoolStats(CHECKPOINT_POOL, self.capacity, self.capacity - store_held, 0, expected)

    def stats(self) -> CheckpointStats:
        return CheckpointStats(self.written_total, self.bytes_written_total, self._acked[2])
