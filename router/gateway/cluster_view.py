"""``ClusterView``: the router's views of the replicas, cached in the gateway.

Polled every ``interval_s`` so that a metrics scrape never calls an actor; a replica the router
declares dead is reported once through ``on_dead`` (the router's verdict is final here: the
gateway aborts the calls of that replica's sessions). It also keeps the live replicas' actor
handles (asked of the router when a new replica appears) and, for placement, the snapshots that
replies to this gateway's own calls carried when they are newer than the router's
(``placement_views``): a gateway that opens sessions itself sees its own opens at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from replica.api import ActorError, PoolSnapshot
from router.control.api import ReplicaHealth, ReplicaView
from router.control.client import RouterClient

log = logging.getLogger(__name__)


def newer(snapshot: PoolSnapshot, than: PoolSnapshot | None) -> bool:
    """Whether ``snapshot`` is a later snapshot of the same replica incarnation than ``than``."""
    return than is None or (snapshot.incarnation == than.incarnation and snapshot.seq > than.seq)


class ClusterView:
    def __init__(
        self,
        router: RouterClient,
        on_dead: Callable[[str], None],
        interval_s: float = 1.0,
    ) -> None:
        self.router = router
        self.on_dead = on_dead
        self.interval_s = interval_s
        self.views: list[ReplicaView] = []
        self.handles: dict[str, Any] = {}  # live replicas' actor handles, by id
        self._fresh: dict[str, PoolSnapshot] = {}  # newer than the router's, from replies
        self._dead: set[str] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def note(self, snapshot: PoolSnapshot) -> None:
        """A replica's snapshot from the reply to one of this gateway's calls."""
        if newer(snapshot, self._fresh.get(snapshot.replica_id)):
            self._fresh[snapshot.replica_id] = snapshot

    def placement_views(self) -> list[ReplicaView]:
        """The views, each with the newest snapshot known here."""
        out = []
        for view in self.views:
            fresh = self._fresh.get(view.replica_id)
            if fresh is not None and view.snapshot is not None and newer(fresh, view.snapshot):
                view = dataclasses.replace(view, snapshot=fresh)
            out.append(view)
        return out

    async def _poll(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - the router may be restarting
                log.warning("could not read replica views from the router: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def refresh(self) -> None:
        """One poll: the views, then the handles of replicas new here."""
        views = await self.router.views(retry=False)
        if isinstance(views, ActorError):
            return
        self.views = views
        dead = {v.replica_id for v in views if v.health == ReplicaHealth.DEAD}
        for replica_id in dead - self._dead:
            self.on_dead(replica_id)
        self._dead = dead
        live = {v.replica_id for v in views} - dead
        for replica_id in set(self._fresh) - live:
            del self._fresh[replica_id]
        if live - set(self.handles):
            handles = await self.router.replica_handles(retry=False)
            if not isinstance(handles, ActorError):
                self.handles = handles
        for replica_id in set(self.handles) - live:
            del self.handles[replica_id]
