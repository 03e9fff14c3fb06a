"""``CheckpointOutbox``: a replica's checkpoints on their way to its ``CheckpointStore``, and the
turn endings that wait for them.

The store pulls ``stream``: its items are lists of this outbox's entries
(``replica.checkpoints.entries``), in order, numbered from 1, read by the store from a socket
of its own (``replica.actor.checkpoint_socket``: into the store's memory) or as Ray's
streaming call ``ReplicaActor.checkpoint_stream`` (each an object the *store* owns: Ray makes
the caller of a streaming call the owner of its items); either way they outlive this replica's
process. Either runs with a backpressure of one item: an item's ``yield`` returns once the
store has taken it, which is when its entries count as stored (no message of their own); the
store's acknowledgements (``acked``, by entry number, at most every ``ACK_INTERVAL_S``) carry
its counts for the accounting. A store that writes checkpoints to disk first
(``--checkpoint-dir``) confirms each item by acknowledgement instead.

A turn's last event is held back until the checkpoint of that turn's end is stored (``outputs``,
a ``HeldOutputs``, bounded by ``TurnHolds.hold_s``), so a client that saw a turn end finds its
session at that turn's committed tokens after a failover (but for a chat turn, which names the
state it continues: ``unheld`` in the batch).

One store follows at a time: a store that calls ``stream`` replaces the one before (whose stream
ends) and starts over from nothing. A store that is gone may never end its stream itself (Ray
keeps a streaming call running after its caller's death, and a socket learns of it only at its
next item; one waiting on a dead store's backpressure stays suspended, holding only its last
item), so ``disconnect`` ends it: the replica's
watch calls it when the store died or acknowledged nothing for ``stall_s`` (a hung store's
stream is ended only once it answers again, ``end_abandoned``). Without a connected
store nothing is queued or held, and every open session is *unprotected*; ``protected`` names
the sessions of which the connected store holds a checkpoint. ``unsaved`` names the sessions
holding committed state that no connected store holds since a store went (those it held, and
those whose state changed while none followed): reported in ``let_go`` with the sessions whose
holds were given up, until a checkpoint of each is stored, so a failover never opens one of them
again empty.

The ``checkpoints`` pool is ``counts``' (``CheckpointCounts``), as of the store's last
acknowledgement; ``unacked`` (in ``stats``) counts the entries queued since: the pool is final
when it is 0. Used on the actor's event loop only (``pool_stats`` and ``stats`` may be read from
the engine thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable

from replica.api import CheckpointStats, PoolStats
from replica.checkpoints.durable_waits import DurableWaits
from replica.checkpoints.entries import (
    CheckpointBlank,
    CheckpointDrop,
    CheckpointEntry,
    next_entries,
)
from replica.checkpoints.held_outputs import HeldOutputs
from replica.checkpoints.holds import HOLD_S
from replica.checkpoints.log import CheckpointBatch
from replica.checkpoints.outbox_counts import CheckpointCounts
from replica.engine.step_outputs import StepOutputs

log = logging.getLogger(__name__)

STALL_S = 10.0  # a store that acknowledges nothing for this long is gone
# a store's acknowledgements carry counts only (the stream says what it has): this often at most
ACK_INTERVAL_S = 0.5


class CheckpointOutbox:
    def __init__(
        self,
        dispatch: Callable[[list[StepOutputs]], None],
        capacity: int,
        on_connected: Callable[[bool], None] = lambda connected: None,
        stall_s: float = STALL_S,
        hold_s: float = HOLD_S,
    ) -> None:
        self.send_events = dispatch
        self.on_connected = on_connected
        self.counts = CheckpointCounts(capacity)
        self.stall_s = stall_s
        self.outputs = HeldOutputs(dispatch, hold_s)
        self.connected = False
        self.protected: frozenset[str] = frozenset()  # replaced whole: read by the engine thread
        self.unsaved: frozenset[str] = frozenset()  # the same
        self._queue: asyncio.Queue | None = None  # the connected store's stream
        self.abandoned: asyncio.Queue | None = None  # a hung store's stream, left open
        self.acks_late = False  # set by the replica's watch: an item waits past the hold bound
        self._seq = 0  # items queued so far
        self._sent_at: dict[int, float] = {}  # unacknowledged items: when queued
        self._chains: dict[str, int] = {}  # session id -> committed_len of its last record queued
        self.durable_waits = DurableWaits()
        self._blank_at: dict[str, int] = {}  # session id -> number of its blank entry on its way

    # ----- the engine's output ----------------------------------------------------------------

    def push(self, batch: CheckpointBatch) -> None:
        """Queue one engine step's checkpoints (before that step's events are dispatched)."""
        for session_id in batch.released:
            self.outputs.holds.forget(session_id)
        if batch.released and self.protected:
            self.protected = self.protected.difference(batch.released)
        if batch.unsaved or (batch.released and self.unsaved):
            self.unsaved = self.unsaved.union(batch.unsaved).difference(batch.released)
        if not self.connected:
            return
        if batch.released:  # nothing of theirs is left to protect
            self.counts.released(batch.released, batch.dropped)
            for session_id in batch.released:
                self._chains.pop(session_id, None)
                self._blank_at.pop(session_id, None)
            self.durable_waits.settle(batch.released)
        if batch.dropped:
            self._put(CheckpointDrop(tuple(batch.dropped)))
        if batch.blank:
            seq = self._put(CheckpointBlank(tuple(batch.blank)))
            self._blank_at.update((session_id, seq) for session_id, _, _ in batch.blank)
        unheld = batch.unheld
        for record in batch.saved:
            meta = record.sessions[0]
            session_id = meta.session_id
            if meta.kv_from and self._chains.get(session_id) != meta.kv_from:
                # a delta taken for the store before this one: this store gets the whole state
                # (every session is checkpointed again when a store connects)
                continue
            self._chains[session_id] = meta.committed_len
            self.counts.saved(session_id, record.nbytes)
            self.outputs.wait(session_id, self._put(record), hold=session_id not in unheld)

    def _put(self, item: CheckpointEntry) -> int:
        self._seq += 1
        self._sent_at[self._seq] = time.monotonic()
        self.counts.sent(self._seq)
        self._queue.put_nowait((self._seq, item))
        return self._seq

    def dispatch(self, outputs: list[StepOutputs]) -> None:
        """Send the engine's outputs on, those of sessions whose checkpoint is on its way held."""
        self.outputs.dispatch(outputs)

    # ----- the store's side -------------------------------------------------------------------

    async def stream(self, confirm_on_ack: bool) -> AsyncIterator[list[CheckpointEntry]]:
        """The items, until this store is replaced or disconnected, for the one store that
        follows this replica (a new one replaces the one before). Each item is every entry
        queued since the item before, in order (one while the store keeps up, several when it
        lags). The store's call takes it with a backpressure of one item (``ReplicaClient.
        checkpoint_stream``), so an item's ``yield`` returns once the store has it: its sessions
        count as stored from then on, their held turn endings go on; with ``confirm_on_ack`` (a
        store that writes each checkpoint to disk first) only at its acknowledgement."""
        if self._queue is not None:
            self.disconnect("another checkpoint store follows this replica")
        queue = self._queue = asyncio.Queue()
        self._connect(True)
        try:
            ended = False
            while not ended:
                entries = await next_entries(queue)
                if None in entries:
                    ended, entries = True, entries[: entries.index(None)]
                if entries:
                    yield [item for _, item in entries]
                    if not confirm_on_ack and self._queue is queue:
                        self._stored(entries[-1][0])
        finally:
            if self._queue is queue:  # ended from the store's side
                self._queue = None
                self._connect(False)
                self._reset()

    def _connect(self, connected: bool) -> None:
        self.connected = connected
        self.on_connected(connected)

    def disconnect(self, why: str, end_stream: bool = True) -> None:
        """The store is gone (or replaced): end its stream (without ``end_stream``, a hung
        store's, only at ``end_abandoned``: Ray's end of a streaming call waits for its caller,
        a stopped one would stall this actor), forget what was in flight, send held events on."""
        queue, self._queue = self._queue, None
        if queue is None:
            return
        log.error("checkpoint store disconnected: %s; sessions are unprotected meanwhile", why)
        if end_stream:
            queue.put_nowait(None)
        else:
            self.abandoned = queue
        self._connect(False)
        self._reset()

    def end_abandoned(self) -> None:
        """The hung store answers again: end the stream left open (it then follows anew)."""
        queue, self.abandoned = self.abandoned, None
        if queue is not None:
            queue.put_nowait(None)

    def close(self) -> None:
        """The replica is dead: end the stream (the store keeps what it has)."""
        self.disconnect("the replica is dead")

    def acked(self, seq: int, store_held: int, store_bytes: int) -> None:
        """The store has taken every item up to ``seq`` into its count, and holds
        ``store_held`` checkpoints now (the accounting's figures; acknowledgements come at most
        every ``ACK_INTERVAL_S``, or for each item when they confirm)."""
        if not self.connected:
            return  # a store that is no longer followed: its count is of another stream
        self.counts.acked_by_store(seq, store_held, store_bytes)
        for done in [s for s in self._sent_at if s <= seq]:
            del self._sent_at[done]
        self._stored(seq)

    def _stored(self, seq: int) -> None:
        """The store has every item up to ``seq``: their sessions are protected, and their held
        turn endings go on (idempotent)."""
        stored = self.outputs.stored(seq)
        if stored:
            self.protected = self.protected.union(stored)
            self.unsaved = self.unsaved.difference(stored)
        blank = [sid for sid, at in self._blank_at.items() if at <= seq]
        for session_id in blank:
            del self._blank_at[session_id]
        self.durable_waits.settle(stored, blank)

    async def durable(self, session_ids: list[str]) -> bool:
        """Wait until a checkpoint of each of ``session_ids`` taken from now on is stored, or,
        for one that holds nothing yet, its blank entry (all a failover needs to open it again
        empty): a session that arrived by migration is safe from its new replica's death from
        then on. One stored already, or released meanwhile, waits for nothing. False when that
        did not happen within ``stall_s`` or no store is connected."""
        if not self.connected or not session_ids:
            return False
        waiting = set(session_ids).difference(self.protected)  # those stored already are
        if not waiting:
            return True
        return await self.durable_waits.wait(waiting, self.stall_s)

    def unacked_s(self) -> float:
        """How long the oldest unacknowledged item has waited (0: none waits)."""
        return time.monotonic() - min(self._sent_at.values(), default=time.monotonic())

    def _reset(self) -> None:
        """Forget everything in flight and send every held event on; the sessions whose state
        the store held or was to hold are ``unsaved`` from now on."""
        self.unsaved = self.unsaved.union(
            self.counts.expected, self.outputs.waiting, self.outputs.holds.holding()
        )
        self._seq = 0
        self._sent_at.clear()
        self.counts.reset()
        self._chains.clear()
        self._blank_at.clear()
        self.protected = frozenset()
        self.outputs.release_all()
        self.durable_waits.fail_all()

    # ----- accounting -------------------------------------------------------------------------

    def pool_stats(self) -> PoolStats:
        """The ``checkpoints`` pool (``CheckpointCounts.pool_stats``)."""
        return self.counts.pool_stats()

    def stats(
        self, open_sessions: Iterable[str] = (), noted: Callable[[str], bool] = lambda s: False
    ) -> CheckpointStats:
        """The totals, and how many of ``open_sessions`` have no checkpoint in the store: all
        while no store follows; else those not stored, except those ``noted`` (a first
        checkpoint on its way, or nothing to lose yet) while acknowledgements are on time and
        its turn's end was not let go."""
        protected, prompt = self.protected, self.connected and not self.acks_late
        let_go = self.outputs.holds.given_up | self.unsaved
        unprotected = sum(
            1
            for sid in open_sessions
            if sid not in protected and not (prompt and noted(sid) and sid not in let_go)
        )
        counts = self.counts
        _, _, store_bytes, acked_seq = counts.acked  # read before ``_seq``: never too few
        unacked = self._seq - acked_seq if self.connected else 0
        totals = counts.written_total, counts.bytes_written_total, store_bytes
        return CheckpointStats(*totals, unprotected, counts.recheckpointed_total, let_go, unacked)
