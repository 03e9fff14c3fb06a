"""The router's tables: ``SessionTable`` (one ``SessionEntry`` per session) and ``ReplicaEntry``
per replica. Owned by the ``SessionRouter`` actor; gateways see only what it makes of them
(``router.control.api``: ``Route`` and ``ReplicaView``).

A session is either pinned to a replica (``SessionState.OPEN``) or remembered for a while as lost
with its replica (``SessionState.ABORTED``, so late callers learn ABORTED rather than NOT_FOUND).
While it moves to another replica (migration, failover) its entry's ``moving`` future is set:
routes wait for it, then read the table again (the move re-pinned it, or left it where it was).
The table keeps its per-replica index in step with the entries itself: callers only pin, forget
and abort.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cachetools import LRUCache

from replica.actor.client import ReplicaClient
from replica.api import PoolSnapshot, ReplicaDescription
from replica.checkpoints.store_client import CheckpointStoreClient
from router.control.api import ReplicaHealth, ReplicaView

MAX_TOMBSTONES = 100_000


class SessionState(enum.Enum):
    OPEN = "open"
    ABORTED = "aborted"  # its replica died and its state is gone


@dataclass(frozen=True, slots=True)
class BlankOpen:
    """How a session was opened holding nothing (no prefix): a failover that finds no
    checkpoint of it opens it again, empty, with the same id, tenant and idle timeout, so long
    as the store it read has followed the replica since before this open (``store_epoch``): its
    first checkpoint was on its way, and no turn of it ended for a client without one."""

    idle_timeout_s: float
    store_epoch: int


@dataclass(slots=True, eq=False)
class SessionEntry:
    session_id: str
    replica_id: str
    tenant: str
    state: SessionState = SessionState.OPEN
    moving: asyncio.Future | None = None  # set while the session moves; done when it has
    blank: BlankOpen | None = None  # opened empty, pinned where it opened (never moved since)


class SessionTable:
    """Open sessions by id, the sessions pinned to each replica, and bounded tombstones of
    sessions lost with their replica (least recently lost dropped first)."""

    def __init__(self, max_tombstones: int = MAX_TOMBSTONES) -> None:
        self._open: dict[str, SessionEntry] = {}
        self._by_replica: dict[str, set[str]] = {}
        self._aborted: LRUCache[str, SessionEntry] = LRUCache(max_tombstones)
        # sessions their replica released on its own (idle timeout) -> that replica
        self._released: LRUCache[str, str] = LRUCache(max_tombstones)

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._open

    def get(self, session_id: str) -> SessionEntry | None:
        """The open session, or its tombstone (state ABORTED), or None."""
        return self._open.get(session_id) or self._aborted.get(session_id)

    def pin(
        self, session_id: str, replica_id: str, tenant: str, blank: BlankOpen | None = None
    ) -> SessionEntry:
        self.forget(session_id)
        entry = self._open[session_id] = SessionEntry(session_id, replica_id, tenant, blank=blank)
        self._by_replica.setdefault(replica_id, set()).add(session_id)
        self._aborted.pop(session_id, None)
        self._released.pop(session_id, None)
        return entry

    def released_by(self, session_id: str, replica_id: str) -> None:
        """``replica_id`` released the session on its own (idle timeout): forget it there, and
        remember it, so that a gateway's pin of it that was sent before the release and lands
        after it (``was_released``) is refused rather than pinning a session nobody holds."""
        self.forget(session_id, replica_id)
        self._released[session_id] = replica_id

    def was_released(self, session_id: str, replica_id: str) -> bool:
        """Whether ``replica_id`` reported the session released (and it was not pinned since)."""
        return self._released.get(session_id) == replica_id

    def forget(self, session_id: str, replica_id: str | None = None) -> bool:
        """Drop an open session (closed or released) -- only if it is pinned to ``replica_id``
        when given (a replica reporting a release speaks for itself, not for the replica a
        session has moved to); returns whether it was dropped."""
        entry = self._open.get(session_id)
        if entry is None or (replica_id is not None and entry.replica_id != replica_id):
            return False
        del self._open[session_id]
        self._by_replica[entry.replica_id].discard(session_id)
        return True

    def pinned_to(self, replica_id: str) -> int:
        return len(self._by_replica.get(replica_id, ()))

    def sessions_of(self, replica_id: str) -> list[str]:
        return sorted(self._by_replica.get(replica_id, ()))

    def abort(self, session_ids: list[str]) -> int:
        """These sessions' state is gone with their replica: each becomes a tombstone."""
        lost = 0
        for session_id in session_ids:
            entry = self._open.pop(session_id, None)
            if entry is None:
                continue
            self._by_replica[entry.replica_id].discard(session_id)
            entry.state = SessionState.ABORTED
            self._aborted[session_id] = entry
            lost += 1
        return lost


@dataclass(slots=True, eq=False)
class ReplicaEntry:
    handle: Any
    desc: ReplicaDescription
    health: ReplicaHealth = ReplicaHealth.HEALTHY
    snapshot: PoolSnapshot | None = None
    reported_at: float = field(default_factory=time.monotonic)
    reserved: int = 0  # opens in flight, which no snapshot counts yet
    lost: int = 0  # sessions lost when the replica died
    died_at: float | None = None  # time.monotonic() when it was declared dead
    checkpoints: Any = None  # the handle of its checkpoint store, when it checkpoints
    store_epoch: int = 0  # stores it has had before ``checkpoints`` (one more per replacement)
    failover: asyncio.Task | None = None  # restores its sessions once it is dead
    migrated: Counter[str] = field(default_factory=Counter)  # sessions moved away, by reason
    call_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (method, kind)

    @property
    def replica(self) -> ReplicaClient:
        """The typed calls to the replica (its current handle)."""
        return ReplicaClient(self.handle)

    @property
    def store(self) -> CheckpointStoreClient:
        """The typed calls to its checkpoint store (``checkpoints`` must be set)."""
        return CheckpointStoreClient(self.checkpoints)

    def take(self, snapshot: PoolSnapshot) -> None:
        """Keep ``snapshot`` when it is newer than the one held (periodic reports and the
        replies to opens and closes race; the newest wins)."""
        held = self.snapshot
        if held is None or held.incarnation != snapshot.incarnation or snapshot.seq > held.seq:
            self.snapshot = snapshot
            self.reported_at = time.monotonic()

    def view(self, replica_id: str, pinned: int, moving: int = 0) -> ReplicaView:
        """What the router hands out about this replica (placement, metrics, ListReplicas)."""
        age = time.monotonic() - self.reported_at if self.snapshot else 0.0
        return ReplicaView(
            replica_id,
            self.desc.node_id,
            self.health,
            self.snapshot,
            age,
            pinned,
            self.desc.mamba_slots_per_session,
            self.desc.kv_tokens_per_session,
            self.lost,
            dict(self.migrated),
            moving,
            dict(self.call_errors),
        )
