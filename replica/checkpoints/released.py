"""``ReleasedSessions``: the sessions a checkpoint store heard its replica release.

A replica sends a ``CheckpointDrop`` when it releases a session (closed, idle timeout, moved
away), and the store frees that session's checkpoint. If the replica dies before its next
report to the router, the router still pins the session there, and its failover finds no
checkpoint: without this record it would count the session lost (``ABORTED``,
``SessionsLostWithReplica``) although the replica ended it on purpose. The store remembers
the ids of the last ``limit`` drops it applied; a session that comes back to the replica (a
move back, a restore) is forgotten at its first checkpoint or blank entry there.
"""

from __future__ import annotations

from collections.abc import Iterable

RELEASED_KEPT = 10_000  # about an hour of a busy replica's releases


class ReleasedSessions:
    def __init__(self, limit: int = RELEASED_KEPT) -> None:
        self.limit = limit
        self._ids: dict[str, None] = {}  # insertion-ordered: the oldest is dropped first

    def add(self, session_ids: Iterable[str]) -> None:
        for sid in session_ids:
            self._ids.pop(sid, None)
            self._ids[sid] = None
        while len(self._ids) > self.limit:
            del self._ids[next(iter(self._ids))]

    def forget(self, session_id: str) -> None:
        """The session holds state or a blank entry here again: it is open."""
        self._ids.pop(session_id, None)

    def among(self, session_ids: Iterable[str]) -> list[str]:
        return [sid for sid in session_ids if sid in self._ids]
