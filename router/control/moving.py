"""``MovingSessions``: which sessions are moving between replicas now, and the pin switch.

A move (migration or failover) first *claims* its sessions: each claimed session's table entry
gets a ``moving`` future, which routes wait on, and is counted against its source replica
(``moving``, shown per replica in ListReplicas' views, /metrics and ``top``). ``land`` pins a
session to the replica that now holds its state and wakes its routes; ``release`` ends the
claims, whatever became of them. A session is claimed by one move at a time: a claim waits for
the move in flight to end.

``land`` pins nothing to a replica declared dead meanwhile (its failover has claimed the
sessions pinned to it already, and would never restore one pinned after), nor a session closed
meanwhile, nor one the target reported released already (forgotten: it ended there): the caller
reads which landed from its answer and deals with the copies left.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from router.control.api import ReplicaHealth
from router.control.registry import ReplicaRegistry
from router.control.table import BlankOpen, SessionState, SessionTable


class MovingSessions:
    def __init__(self, sessions: SessionTable, replicas: ReplicaRegistry) -> None:
        self.sessions = sessions
        self.replicas = replicas
        self.moving: Counter[str] = Counter()  # claimed sessions, by source replica
        self._sources: dict[str, str] = {}  # claimed session -> its source replica

    async def claim(self, session_ids: Sequence[str], replica_id: str) -> dict[str, asyncio.Future]:
        """Mark the sessions pinned to ``replica_id`` moving in the table, after any move of
        them in flight has ended; returns each one's future (done when its move is)."""
        while True:
            busy = [e.moving for e in map(self.sessions.get, session_ids) if e and e.moving]
            if not busy:
                break
            await asyncio.gather(*map(asyncio.shield, busy))
        loop = asyncio.get_running_loop()
        claimed = {}
        for sid in session_ids:
            entry = self.sessions.get(sid)
            if entry and entry.state == SessionState.OPEN and entry.replica_id == replica_id:
                entry.moving = claimed[sid] = loop.create_future()
                self._sources[sid] = replica_id
                self.moving[replica_id] += 1
        return claimed

    def release(self, claimed: dict[str, asyncio.Future]) -> None:
        """The moves of ``claimed`` are over: wake their routes (the table says where each is)."""
        for sid, done in claimed.items():
            entry = self.sessions.get(sid)
            if entry is not None and entry.moving is done:
                entry.moving = None
            if not done.done():
                done.set_result(None)
            source = self._sources.pop(sid, None)
            if source is not None:
                self.moving[source] -= 1
                if not self.moving[source]:
                    del self.moving[source]

    def land(
        self, session_ids: Sequence[str], replica_id: str, blank_epoch: int | None = None
    ) -> list[str]:
        """Pin sessions to the replica that now holds their state, and wake their routes;
        returns those pinned: none when the replica is dead or unknown, and none of those
        no longer open (closed, or aborted, meanwhile). ``blank_epoch``: they were opened
        there again, empty (``BlankReopen``), at that store epoch of the replica's: they stay
        blank there, and may be opened again empty if that replica dies too."""
        target = self.replicas.get(replica_id)
        if target is None or target.health == ReplicaHealth.DEAD:
            return []
        pinned = []
        for sid in session_ids:
            entry = self.sessions.get(sid)
            if entry is None or entry.state != SessionState.OPEN:
                continue
            if self.sessions.was_released(sid, replica_id):
                # its idle timeout ended it on the target before this pin (a move waits for
                # the target's first checkpoint of it): nobody holds it, it is closed
                self.sessions.forget(sid)
                continue
            moving = entry.moving
            empty = None
            if blank_epoch is not None and entry.blank is not None:
                empty = BlankOpen(entry.blank.idle_timeout_s, blank_epoch)
            self.sessions.pin(sid, replica_id, entry.tenant, empty)
            pinned.append(sid)
            if moving is not None and not moving.done():
                moving.set_result(None)
        return pinned
