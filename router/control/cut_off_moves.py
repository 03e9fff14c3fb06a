"""``CutOffMoves``: the moves a router's death cut off, finished by the router Ray restarted.

A move marks its sessions *moving* on the source, imports them on the target, pins them there,
then has the source release its copies (``router.control.migration``). A router that dies in
between leaves a session marked moving on its source, and, if the import had landed, a second
copy on the target; the new router learns both from the replicas' registrations, each replica
naming the sessions it holds and those of them marked moving. It keeps one copy of each:

- registered by two live replicas, one of which marks it moving: the target's copy is kept (the
  move had landed: both copies hold the same state, as the source took no turn once marked), and
  the source releases its own (``finish_export`` with ``moved``: reason ``migrated``);
- marked moving on its source only, once every replica has registered (``replicas accounted``):
  the move had not landed, and the source takes it back (``finish_export`` without ``moved``),
  instead of refusing its turns until the mark's time-out.

An import still running on the target when the router died lands before the target has
registered (the new router then sees both copies, as above) or not at all: the target refuses
a move sent by a router it no longer reports to (``replica.actor.moves``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from replica.api import PoolSnapshot
from router.call_errors import CallFailure, log_failure
from router.control.api import ReplicaHealth
from router.control.registry import ReplicaRegistry
from router.control.table import SessionState, SessionTable

log = logging.getLogger(__name__)


class CutOffMoves:
    def __init__(self, replicas: ReplicaRegistry, sessions: SessionTable) -> None:
        self.replicas = replicas
        self.sessions = sessions
        self.sources: dict[str, str] = {}  # session id -> the replica that registered it moving

    def sort(
        self, replica_id: str, session_ids: Iterable[str], moving: set[str]
    ) -> tuple[list[str], list[str], dict[str, list[str]]]:
        """Of the sessions ``replica_id`` registers (``moving``: those it marks moving): those
        it keeps (to pin there), those whose copy there is to be released (its move landed on
        the live replica the table pins them to), and, by replica, the copies elsewhere to be
        released (their source registered before this target). Notes the sources it keeps."""
        keep, release_here, release_elsewhere = [], [], {}
        for sid in session_ids:
            holder = self._live_holder(sid)
            if holder is not None and holder != replica_id:
                if sid in moving:
                    release_here.append(sid)
                    continue
                if self.sources.get(sid) == holder:
                    release_elsewhere.setdefault(holder, []).append(sid)
                    del self.sources[sid]
            keep.append(sid)
            if sid in moving:
                self.sources[sid] = replica_id
        return keep, release_here, release_elsewhere

    def _live_holder(self, session_id: str) -> str | None:
        entry = self.sessions.get(session_id)
        if entry is None or entry.state != SessionState.OPEN:
            return None
        replica = self.replicas.get(entry.replica_id)
        if replica is None or replica.health == ReplicaHealth.DEAD:
            return None
        return entry.replica_id

    async def release(self, replica_id: str, session_ids: list[str]) -> None:
        """``replica_id``'s copies of ``session_ids`` go: their moves landed elsewhere."""
        if session_ids:
            log.warning("%s: %d sessions of a move the router's restart cut off had landed "
                        "elsewhere: released here", replica_id, len(session_ids))  # fmt: skip
            await self._finish(replica_id, session_ids, moved=True)

    async def take_back(self) -> None:
        """Every replica has registered: the sessions still marked moving on the source the
        table pins them to never landed elsewhere; their sources take them back."""
        by_source: dict[str, list[str]] = {}
        for sid, source in self.sources.items():
            entry = self.sessions.get(sid)
            if self._live_holder(sid) == source and entry.moving is None:
                by_source.setdefault(source, []).append(sid)
        self.sources.clear()
        for source, ids in by_source.items():
            log.warning("%s: %d sessions of a move the router's restart cut off never landed: "
                        "they go on there", source, len(ids))  # fmt: skip
            await self._finish(source, ids, moved=False)

    async def _finish(self, replica_id: str, session_ids: list[str], moved: bool) -> None:
        entry = self.replicas.get(replica_id)
        if entry is None or entry.health == ReplicaHealth.DEAD:
            return  # its failover deals with its copies
        try:
            done = await entry.replica.finish_export(session_ids=session_ids, moved=moved)
        except Exception as exc:  # noqa: BLE001 - a dead replica is found by its health checks
            log_failure(log, CallFailure.of("finish_export", f"replica {replica_id}", exc))
            return
        if isinstance(done, PoolSnapshot):
            entry.take(done)
        else:
            log.warning("%s refused to finish a cut-off move: %s", replica_id, done.message)
