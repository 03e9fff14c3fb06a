"""``CheckpointOutbox``: a replica's checkpoints on their way to its ``CheckpointStore``, and the
turn endings that wait for them.

The store pulls: it holds one long-lived streaming call, ``ReplicaActor.checkpoint_stream``,
whose items are lists of this outbox's entries, in order: a ``SessionStates`` record (one
session's latest state), a ``CheckpointDrop`` (sessions released: free their checkpoints) or a
``CheckpointBlank`` (sessions that hold nothing yet: a failover opens them again empty); drops
and blanks alone wait up to ``DROP_DELAY_S`` for a record to travel with; entries are numbered
from 1. Each item is an object the *store* owns (Ray makes the caller of a
streaming call the owner of its items), so it outlives this replica's process. The call runs
with a backpressure of one item: an item's ``yield`` returns once the store has taken it, which
is when its entries count as stored (no message of their own); the store's acknowledgements
(``acked``, by entry number, at most every ``ACK_INTERVAL_S``) carry its counts for the
accounting. A store that writes checkpoints to disk first (``--checkpoint-dir``) confirms each
item by acknowledgement instead.

A turn's last event is held back until the checkpoint of that turn's end is stored, for
at most ``TurnHolds.hold_s`` (``outputs``, a ``HeldOutputs``), so a client that saw a turn end
will find its session at that turn's committed tokens after a failover (but for a turn that
named the state it continued, a chat turn, whose next turn is refused on any other: ``unheld``
in the batch); the session's later events queue behind it, in order, and every other session's
events go on (a step that holds a turn end waits whole for the store's next take, a few
milliseconds at most).

One store follows at a time: a store that calls ``stream`` replaces the one before (whose stream
ends) and starts over from nothing. A store that is gone never ends its stream itself (Ray keeps
a streaming call running after its caller's death; one waiting on a dead store's backpressure
stays suspended, holding only its last item), so ``disconnect`` ends it: the replica's
watch calls it when the store died or acknowledged nothing for ``stall_s`` (a hung store's
stream is ended only once it answers again, ``end_abandoned``). Without a connected
store nothing is queued or held, and every open session is *unprotected*; ``protected`` names
the sessions of which the connected store holds a checkpoint. ``unsaved`` names the sessions
holding committed state that no connected store holds since a store went (those it held, and
those whose state changed while none followed): reported in ``let_go`` with the sessions whose
holds were given up, until a checkpoint of each is stored, so a failover never opens one of them
again empty.

Accounting, exact at each acknowledgement: ``expected`` is how many sessions of this replica
must have a checkpoint once every item sent so far is applied; the store's acknowledgement says
how many it holds after the same item. The ``checkpoints`` pool: capacity = sessions the replica
can hold, ``session_held`` = expected, ``free`` = capacity - held by the store, so ``leaked`` =
store's count - expected: a checkpoint the store keeps for a released session shows. The
pool is as of the last acknowledgement: ``unacked`` (in ``stats``) counts the entries queued
since, so a reader knows the pool is final only when it is 0.
Used on the actor's event loop only (``pool_stats`` and ``stats`` may be read from the engine
thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from replica.api import CHECKPOINT_POOL, CheckpointStats, PoolStats, SessionStates
from replica.checkpoints.held_outputs import HeldOutputs
from replica.checkpoints.holds import HOLD_S
from replica.checkpoints.log import CheckpointBatch
from replica.engine.step_outputs import StepOutputs

log = logging.getLogger(__name__)

STALL_S = 10.0  # a store that acknowledges nothing for this long is gone
# a store's acknowledgements carry counts only (the stream says what it has): this often at most
ACK_INTERVAL_S = 0.5
# drops wait this long at most for a checkpoint to travel with (nothing waits for a drop: a
# stream item of its own for each would cost the store and the replica an item per session)
DROP_DELAY_S = 0.25


@dataclass(frozen=True, slots=True)
class CheckpointDrop:
    """A stream item: free these sessions' checkpoints (they were released)."""

    session_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CheckpointBlank:
    """A stream item: these sessions hold nothing yet (session id, tenant, idle timeout)."""

    sessions: tuple[tuple[str, str, float], ...]


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
        self.capacity = capacity
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
        self._expected: set[str] = set()
        self._expected_after: dict[int, int] = {}  # item seq -> len(expected) after it
        self._unfreed = 0  # sessions released without their checkpoint freed, so far
        self._unfreed_at: dict[int, int] = {}  # item seq -> ``_unfreed`` when it was queued
        self._chains: dict[str, int] = {}  # session id -> committed_len of its last record queued
        self._durable: list[tuple[set[str], asyncio.Future]] = []  # ``durable`` callers
        self._blank_at: dict[str, int] = {}  # session id -> number of its blank entry on its way
        self._acked = (0, 0, 0, 0)  # (store held, expected, store bytes, entry) at the last ack
        self.written_total = 0
        self.bytes_written_total = 0
        self.recheckpointed_total = 0

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
        dropped = set(batch.dropped)
        unfreed = [s for s in batch.released if s in self._expected and s not in dropped]
        self._expected.difference_update(batch.released)
        for session_id in batch.released:
            self._chains.pop(session_id, None)
            self._blank_at.pop(session_id, None)
        if batch.released:  # nothing of theirs is left to protect
            self._settle(batch.released)
        if unfreed:  # released, their checkpoints not freed (a failpoint): leaked from now on
            self._unfreed += len(unfreed)
            store_held, expected, store_bytes, seq = self._acked
            self._acked = (store_held, expected - len(unfreed), store_bytes, seq)
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
            self._expected.add(session_id)
            self.outputs.wait(session_id, self._put(record), hold=session_id not in unheld)
            self.written_total += 1
            self.bytes_written_total += record.nbytes

    def _put(self, item: SessionStates | CheckpointDrop | CheckpointBlank) -> int:
        self._seq += 1
        self._sent_at[self._seq] = time.monotonic()
        self._expected_after[self._seq] = len(self._expected)
        self._unfreed_at[self._seq] = self._unfreed
        self._queue.put_nowait((self._seq, item))
        return self._seq

    def dispatch(self, outputs: list[StepOutputs]) -> None:
        """Send the engine's outputs on, those of sessions whose checkpoint is on its way held."""
        self.outputs.dispatch(outputs)

    # ----- the store's side -------------------------------------------------------------------

    async def stream(
        self, confirm_on_ack: bool
    ) -> AsyncIterator[list[SessionStates | CheckpointDrop | CheckpointBlank]]:
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
                entries = await _next_entries(queue)
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
        expected = self._expected_after.get(seq, len(self._expected))
        expected -= self._unfreed - self._unfreed_at.get(seq, self._unfreed)  # leaked since
        self._acked = (store_held, expected, store_bytes, seq)
        for done in [s for s in self._sent_at if s <= seq]:
            del self._sent_at[done]
        for done in [s for s in self._expected_after if s < seq]:
            del self._expected_after[done]
            self._unfreed_at.pop(done, None)
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
        self._settle(stored, blank)

    def _settle(self, *done_ids: Iterable[str]) -> None:
        """``durable`` callers stop waiting for ``done_ids``; those left with none are done."""
        for waiting, done in self._durable:
            waiting.difference_update(*done_ids)
            if not waiting and not done.done():
                done.set_result(True)
        self._durable = [(w, f) for w, f in self._durable if not f.done()]

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
        done = asyncio.get_running_loop().create_future()
        self._durable.append((waiting, done))
        try:
            return await asyncio.wait_for(done, self.stall_s)
        except asyncio.TimeoutError:
            return False

    def unacked_s(self) -> float:
        """How long the oldest unacknowledged item has waited (0: none waits)."""
        return time.monotonic() - min(self._sent_at.values(), default=time.monotonic())

    def _reset(self) -> None:
        """Forget everything in flight and send every held event on; the sessions whose state
        the store held or was to hold are ``unsaved`` from now on."""
        self.unsaved = self.unsaved.union(
            self._expected, self.outputs.waiting, self.outputs.holds.holding()
        )
        self._seq = 0
        self._sent_at.clear()
        self._expected_after.clear()
        self._unfreed_at.clear()
        self._expected.clear()
        self._chains.clear()
        self._blank_at.clear()
        self._acked = (0, 0, 0, 0)
        self.protected = frozenset()
        self.outputs.release_all()
        for _, done in self._durable:
            if not done.done():
                done.set_result(False)
        self._durable = []

    # ----- accounting -------------------------------------------------------------------------

    def pool_stats(self) -> PoolStats:
        """The ``checkpoints`` pool as of the last acknowledgement (all free while no store is
        connected: none holds a checkpoint of this replica then)."""
        store_held, expected, _, _ = self._acked
        return PoolStats(CHECKPOINT_POOL, self.capacity, self.capacity - store_held, 0, expected)

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
        _, _, store_bytes, acked_seq = self._acked  # read before ``_seq``: never too few
        unacked = self._seq - acked_seq if self.connected else 0
        totals = self.written_total, self.bytes_written_total, store_bytes
        return CheckpointStats(*totals, unprotected, self.recheckpointed_total, let_go, unacked)


async def _next_entries(queue: asyncio.Queue) -> list:
    """The entries of the next stream item: every one queued (waiting for one), except that
    drops and blanks alone wait up to ``DROP_DELAY_S`` for a checkpoint or the stream's end
    (``None``).
    Entries keep their order and numbers, so the accounting of each acknowledgement holds."""
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
