"""``ResponseSweeper``: every ``interval_s``, releases the states of stored responses past their
time to live, and reads how many states the store keeps per replica (for /metrics). Every
gateway sweeps (a sweep is idempotent: each expired state is handed out once)."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, Gauge

from router.control.response_store import ResponseStoreClient
from router.http.turns import Turns

log = logging.getLogger(__name__)


class ResponseSweeper:
    def __init__(
        self,
        store: ResponseStoreClient,
        turns: Turns,
        registry: CollectorRegistry | None,
        interval_s: float = 10.0,
    ) -> None:
        """``registry``: where to export the gauges (None: another gateway does)."""
        self.store, self.turns, self.interval_s = store, turns, interval_s
        self.responses = self.states = None
        if registry is not None:
            self.responses = Gauge(
                "session_router_stored_responses",
                "Stored Responses-API responses, with a conversation state or not.",
                registry=registry,
            )
            self.states = Gauge(
                "session_router_stored_response_states",
                "Stored Responses-API responses that hold a conversation state, by replica.",
                ["replica"],
                registry=registry,
            )
        self._seen: set[str] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def sweep(self) -> None:
        for session_id, tenant in await self.store.sweep():
            self.turns.release(session_id, tenant)
        if self.responses is not None and self.states is not None:
            stats = await self.store.stats()
            self.responses.set(stats.responses)
            for replica in self._seen - set(stats.states):
                self.states.remove(replica)
            for replica, count in stats.states.items():
                self.states.labels(replica).set(count)
            self._seen = set(stats.states)

    async def _loop(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as exc:  # noqa: BLE001 - the store may be restarting
                log.warning("could not sweep stored responses: %s", exc)
            await asyncio.sleep(self.interval_s)
