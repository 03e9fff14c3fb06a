"""``Periodic``: a round of work every ``interval_s`` on the running event loop, until stopped.
A round that raises is logged and the next one runs (the serve process's supervisor and
autoscaler: whatever failed is tried again next round)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(self, what: str, round_: Callable[[], Awaitable[None]], interval_s: float) -> None:
        self.what = what
        self.round = round_
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.round()
            except Exception as exc:  # noqa: BLE001 - tried again next round
                log.warning("%s failed this round: %s", self.what, exc)
