"""``ClusterView``: the router's views of the replicas, cached in the gateway.

Polled every ``interval_s`` so that a metrics scrape never calls an actor; a replica the router
declares dead is reported once through ``on_dead`` (the router's verdict is final here: the
gateway aborts the calls of that replica's sessions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from replica.api import ActorError
from router.control.views import ReplicaHealth, ReplicaView
from router.gateway.router_client import RouterClient

log = logging.getLogger(__name__)


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
        self._dead: set[str] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _poll(self) -> None:
        while True:
            try:
                views = await self.router.call("views", retry=False)
                if not isinstance(views, ActorError):
                    self.views = views
                    dead = {v.replica_id for v in views if v.health == ReplicaHealth.DEAD}
                    for replica_id in dead - self._dead:
                        self.on_dead(replica_id)
                    self._dead = dead
            except Exception as exc:  # noqa: BLE001 - the router may be restarting
                log.warning("could not read replica views from the router: %s", exc)
            await asyncio.sleep(self.interval_s)
