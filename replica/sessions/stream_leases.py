"""``StreamLeases``: sessions whose idle timeout is suspended because a stream holds them open.

A Converse session lives exactly as long as its stream, so the idle timeout must not release it
while the stream is open, however quiet the client is. The gateway that serves the stream holds
a lease on the session on its replica, granted at open and renewed well within ``lease_s``; a
held session is never idle-expired. If the gateway dies, the renewals stop, the lease lapses and
the session's own idle timeout (counted from its last turn) releases it: a dead gateway cannot
pin slots forever. Leases are bookkeeping only: they hold no slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable


class StreamLeases:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._until: dict[str, float] = {}  # session id -> end of its lease (clock time)

    def hold(self, session_ids: Iterable[str], lease_s: float) -> None:
        """Hold (or renew) each session for ``lease_s`` seconds from now."""
        until = self.clock() + lease_s
        for session_id in session_ids:
            self._until[session_id] = until

    def held(self, session_id: str) -> bool:
        until = self._until.get(session_id)
        return until is not None and until > self.clock()

    def remaining(self, session_ids: Iterable[str]) -> dict[str, float]:
        """Seconds left of each held session's lease (a session that moves takes it along)."""
        now = self.clock()
        return {s: self._until[s] - now for s in session_ids if self.held(s)}

    def prune(self, open_ids: Collection[str]) -> None:
        """Forget lapsed leases and those of sessions no longer open."""
        now = self.clock()
        for session_id in [s for s, t in self._until.items() if t <= now or s not in open_ids]:
            del self._until[session_id]
