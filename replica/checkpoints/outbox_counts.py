"""``CheckpointCounts``: the ``checkpoints`` pool of a replica whose store follows, as of the
store's last acknowledgement, and the checkpoint totals.

Exact at each acknowledgement: ``expected`` names the sessions of this replica that must have a
checkpoint once every entry sent so far is applied; each entry notes how many that was after it
(``sent``), and the store's acknowledgement of an entry says how many it holds after the same
entry. So the pool is: capacity = sessions the replica can hold, ``session_held`` = expected,
``free`` = capacity - held by the store, and ``leaked`` = the store's count - expected: a
checkpoint the store keeps for a released session shows. A session released without its
checkpoint being freed (a failpoint) is *unfreed*: it leaves ``expected`` as released, and the
pool counts it leaked from then on. Owned by the ``CheckpointOutbox``; used on the actor's event
loop only (``pool_stats`` and the totals may be read from the engine thread: ``acked`` is
replaced whole).
"""

from __future__ import annotations

from collections.abc import Iterable

from replica.api import CHECKPOINT_POOL, PoolStats


class CheckpointCounts:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.expected: set[str] = set()
        # (store held, expected, store bytes, entry) at the last acknowledgement
        self.acked = (0, 0, 0, 0)
        self._expected_after: dict[int, int] = {}  # entry -> len(expected) after it
        self._unfreed = 0  # sessions released without their checkpoint freed, so far
        self._unfreed_at: dict[int, int] = {}  # entry -> ``_unfreed`` when it was queued
        self.written_total = 0
        self.bytes_written_total = 0
        self.recheckpointed_total = 0

    def released(self, released: Iterable[str], dropped: Iterable[str]) -> None:
        """Sessions ``released``, the checkpoints of ``dropped`` freed (the rest leak)."""
        released, dropped = list(released), set(dropped)
        unfreed = [s for s in released if s in self.expected and s not in dropped]
        self.expected.difference_update(released)
        if unfreed:  # leaked from now on
            self._unfreed += len(unfreed)
            store_held, expected, store_bytes, seq = self.acked
            self.acked = (store_held, expected - len(unfreed), store_bytes, seq)

    def saved(self, session_id: str, nbytes: int) -> None:
        """A checkpoint of ``session_id`` (``nbytes``) is queued: it must be held from now on."""
        self.expected.add(session_id)
        self.written_total += 1
        self.bytes_written_total += nbytes

    def sent(self, seq: int) -> None:
        """Entry ``seq`` is queued: what the store must hold once it is applied."""
        self._expected_after[seq] = len(self.expected)
        self._unfreed_at[seq] = self._unfreed

    def acked_by_store(self, seq: int, store_held: int, store_bytes: int) -> None:
        """The store has applied every entry up to ``seq`` and holds ``store_held`` checkpoints
        (``store_bytes``) now."""
        expected = self._expected_after.get(seq, len(self.expected))
        expected -= self._unfreed - self._unfreed_at.get(seq, self._unfreed)  # leaked since
        self.acked = (store_held, expected, store_bytes, seq)
        for done in [s for s in self._expected_after if s < seq]:
            del self._expected_after[done]
            self._unfreed_at.pop(done, None)

    def reset(self) -> None:
        """No store follows any more: nothing is expected of one."""
        self.expected.clear()
        self._expected_after.clear()
        self._unfreed_at.clear()
        self.acked = (0, 0, 0, 0)

    def pool_stats(self) -> PoolStats:
        """The ``checkpoints`` pool as of the last acknowledgement (all free while no store is
        connected: none holds a checkpoint of this replica then)."""
        store_held, expected, _, _ = self.acked
        return PoolStats(CHECKPOINT_POOL, self.capacity, self.capacity - store_held, 0, expected)
