"""``BackgroundTasks``: the actor's own coroutines that run beside its calls (the router report
loop, the checkpoint store's watch, a death report, releases after a gateway went).

Each task is kept until it ends, so none is collected while it runs (asyncio keeps only a weak
reference to a task). Used on the actor's event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """Run ``coro`` on the running loop; the task is held until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)
