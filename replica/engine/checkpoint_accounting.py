"""``CheckpointAccounting``: the ``checkpoints`` pool and totals in the engine's snapshots.

The engine builds it; the replica's ``CheckpointOutbox`` (what its store acknowledged) is
connected once, by the actor part that owns the outbox (``connect``). Until then, with
checkpoints on, every checkpoint slot is free; with them off there is no such pool. A session
counts as covered while its first checkpoint is on its way (``CheckpointLog.noted``) or while it
holds nothing yet (a failover opens it again, empty: ``router.control.failover``). Read on the
engine thread (the outbox's counters are replaced whole on the event loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replica.api import CHECKPOINT_POOL, CheckpointStats, PoolStats

if TYPE_CHECKING:
    from replica.checkpoints.log import CheckpointLog
    from replica.checkpoints.outbox import CheckpointOutbox
    from replica.sessions.table import SessionTable


class CheckpointAccounting:
    def __init__(self, capacity: int, log: CheckpointLog | None, sessions: SessionTable) -> None:
        """``log`` None: checkpoints are off."""
        self.capacity = capacity
        self.log = log
        self.sessions = sessions
        self._outbox: CheckpointOutbox | None = None

    def connect(self, outbox: CheckpointOutbox) -> None:
        """From now on the pool and totals are ``outbox``'s (called once, before the engine
        thread starts)."""
        if self._outbox is not None:
            raise RuntimeError("a checkpoint outbox is connected already")
        self._outbox = outbox

    def read(self) -> tuple[PoolStats | None, CheckpointStats]:
        """The ``checkpoints`` pool (None: checkpoints off) and the checkpoint totals."""
        if self.log is None:
            return None, CheckpointStats()
        if self._outbox is None:
            return PoolStats(CHECKPOINT_POOL, self.capacity, self.capacity, 0, 0), CheckpointStats()
        # the totals first: an ``unacked`` of 0 then holds for the pool read after them too
        totals = self._outbox.stats(self.sessions.sessions, self._covered)
        return self._outbox.pool_stats(), totals

    def _covered(self, session_id: str) -> bool:
        slot = self.sessions.sessions.get(session_id)
        return self.log.noted(session_id) or (slot is not None and slot.committed_tokens == 0)
