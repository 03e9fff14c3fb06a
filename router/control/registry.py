"""``ReplicaRegistry``: the router's replicas, by id, and the one place their health changes.

It owns every ``ReplicaEntry`` (the collaborators of ``SessionRouter`` read entries through it and
keep no dict of their own) and the incarnations it has fenced: a replica declared dead, or
retired, may not register again under the same incarnation (the serve process replaces it with
a new one). Health moves only through its methods: ``register`` (HEALTHY), ``set_draining``
(DRAINING, or HEALTHY again), ``mark_dead`` (DEAD, once; it fences the incarnation), and an
entry leaves only by ``retire`` (drained and empty; fenced too) or ``forget_dead``. Its
checkpoint store changes only here too (``register``, ``replace_store``: each new store one
store epoch more). An entry's own figures (its latest snapshot, reservations, call error counts)
are the entry's to keep.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from cachetools import LRUCache

from replica.api import ReplicaDescription
from router.control.api import ReplicaHealth
from router.control.table import ReplicaEntry

MAX_FENCED = 10_000  # incarnations remembered as fenced (least recently fenced dropped first)


class ReplicaRegistry:
    def __init__(self, max_fenced: int = MAX_FENCED) -> None:
        self._entries: dict[str, ReplicaEntry] = {}
        self._fenced: LRUCache[str, bool] = LRUCache(max_fenced)

    # ----- reading ------------------------------------------------------------------------

    def get(self, replica_id: str) -> ReplicaEntry | None:
        return self._entries.get(replica_id)

    def __getitem__(self, replica_id: str) -> ReplicaEntry:
        return self._entries[replica_id]

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def items(self) -> list[tuple[str, ReplicaEntry]]:
        """A copy: callers may await between items while entries come and go."""
        return list(self._entries.items())

    def is_fenced(self, incarnation: str) -> bool:
        return incarnation in self._fenced

    def live_handles(self) -> dict[str, Any]:
        """The actor handle of every replica not dead, by id."""
        return {
            rid: entry.handle
            for rid, entry in self._entries.items()
            if entry.health != ReplicaHealth.DEAD
        }

    def live_stores(self) -> dict[str, Any]:
        """The checkpoint store of every replica not dead that has one, by replica id (the
        latest: a replaced store's successor)."""
        return {
            rid: entry.checkpoints
            for rid, entry in self._entries.items()
            if entry.health != ReplicaHealth.DEAD and entry.checkpoints is not None
        }

    # ----- changing -----------------------------------------------------------------------

    def register(
        self, replica_id: str, handle: Any, desc: ReplicaDescription, checkpoints: Any = None
    ) -> ReplicaEntry:
        """The entry of a replica that (re-)registers, HEALTHY with its current handle: a new
        entry for a new incarnation, the same one refreshed otherwise (its checkpoint store
        kept when none is given). The caller checks ``is_fenced`` first."""
        entry = self._entries.get(replica_id)
        if entry is None or entry.desc.incarnation != desc.incarnation:
            entry = self._entries[replica_id] = ReplicaEntry(handle, desc)
        entry.handle, entry.health = handle, ReplicaHealth.HEALTHY
        if checkpoints is not None and checkpoints != entry.checkpoints:
            entry.store_epoch += entry.checkpoints is not None  # a replacement it was not told of
            entry.checkpoints = checkpoints
        return entry

    def replace_store(self, replica_id: str, store: Any) -> bool:
        """``store`` now keeps the live replica's checkpoints (one store epoch more when it is
        a new one); False when the replica is unknown or dead."""
        entry = self._entries.get(replica_id)
        if entry is None or entry.health == ReplicaHealth.DEAD:
            return False
        if store != entry.checkpoints:
            entry.checkpoints, entry.store_epoch = store, entry.store_epoch + 1
        return True

    def set_draining(self, entry: ReplicaEntry, draining: bool) -> None:
        """Drain or resume a live replica; a dead one stays dead (a drain call that was in
        flight when the replica died must not bring it back)."""
        if entry.health != ReplicaHealth.DEAD:
            entry.health = ReplicaHealth.DRAINING if draining else ReplicaHealth.HEALTHY

    def mark_dead(self, replica_id: str) -> bool:
        """Declare the replica dead and fence its incarnation; False when it was already dead
        (or is unknown): a replica dies once."""
        entry = self._entries.get(replica_id)
        if entry is None or entry.health == ReplicaHealth.DEAD:
            return False
        entry.health, entry.died_at = ReplicaHealth.DEAD, time.monotonic()
        self._fenced[entry.desc.incarnation] = True
        return True

    def retire(self, replica_id: str) -> None:
        """Forget a replica the serve process removes; it may not register again."""
        entry = self._entries.pop(replica_id)
        self._fenced[entry.desc.incarnation] = True

    def forget_dead(self, replica_id: str, entry: ReplicaEntry) -> bool:
        """Forget ``entry`` (dead long enough) if it is still the replica's entry."""
        if self._entries.get(replica_id) is not entry:
            return False
        del self._entries[replica_id]
        return True
