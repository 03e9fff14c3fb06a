"""``Background``: cleanups that must finish even when the call that started them is cancelled
(a client that hangs up still gets its session released). Failures are logged, never raised."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

log = logging.getLogger(__name__)


async def _logged(awaitable: Awaitable) -> None:
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001 - cleanup of a replica that may be gone
        log.warning("background cleanup failed: %s", exc)


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, awaitable: Awaitable) -> asyncio.Task:
        """Run ``awaitable`` (a coroutine or an actor call) to its end on the running loop; its
        task, for a caller that must know when it has ended (``asyncio.wait`` it: a cancelled
        waiter then leaves it running)."""
        task = asyncio.get_running_loop().create_task(_logged(awaitable))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the cleanups still running."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)
