"""``RouterReports``: the typed calls a replica (and the serve process, for a replica it has just
started) makes to the ``SessionRouter``: its registration, its periodic snapshot, its death.

They live here, not with the router's other calls (``router.control.client``), because a replica
never imports the router. A call that fails in Ray raises Ray's error from the awaited method:
the replica's reporter retries on its own schedule (the router may be restarting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica.api import PoolSnapshot, ReplicaDescription, ReportReply


@dataclass(frozen=True, slots=True)
class RouterReports:
    handle: Any  # the SessionRouter's handle

    async def register_replica(
        self,
        *,
        replica_id: str,
        handle: Any,
        desc: ReplicaDescription,
        tenants: dict[str, str] | None = None,
        snapshot: PoolSnapshot | None = None,
        checkpoints: Any = None,
        blank: dict[str, float] | None = None,
        moving: list[str] | None = None,
    ) -> None:
        """Add or refresh replica ``replica_id`` (``handle``), adopting the sessions it holds
        (id -> tenant); ``checkpoints``: the handle of its checkpoint store, if any; ``blank``:
        those of its sessions that hold nothing yet, with their idle timeouts; ``moving``: those
        marked moving out."""
        await self.handle.register_replica.remote(
            replica_id, handle, desc, tenants, snapshot, checkpoints, blank, moving
        )

    async def report(self, *, snapshot: PoolSnapshot, released: list[str]) -> ReportReply:
        """``known`` False: the router does not know this replica (it restarted): register
        again; ``router``: that router's incarnation."""
        return await self.handle.report.remote(snapshot, released)

    async def replica_failed(self, *, replica_id: str, why: str, wait: bool = False) -> Any:
        """Tell the router the replica is dead; without ``wait``, answered at once."""
        return await self.handle.replica_failed.remote(replica_id, why, wait)
