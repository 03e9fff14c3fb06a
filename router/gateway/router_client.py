"""``RouterClient``: the gateway's calls to the ``SessionRouter`` actor.

Ray restarts the router when it dies (``max_restarts=-1``); while it is away, calls that are safe
to repeat (every call the gateway makes is idempotent: an open carries its session id) are
retried for up to ``retry_s``, then answered UNAVAILABLE. Errors come back as ``ActorError``
values, like a replica's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError

from replica.api import ActorError, StatusCode

ROUTER_RETRY_S = 15.0


class RouterClient:
    def __init__(self, handle: Any, retry_s: float = ROUTER_RETRY_S) -> None:
        self.handle = handle
        self.retry_s = retry_s

    async def call(self, method: str, *args: Any, retry: bool = True) -> Any:
        """``router.method(*args)``; retried while the router restarts when ``retry``."""
        deadline = time.monotonic() + (self.retry_s if retry else 0.0)
        while True:
            try:
                return await getattr(self.handle, method).remote(*args)
            except (ActorUnavailableError, RayActorError) as exc:
                if time.monotonic() >= deadline:
                    return ActorError(
                        StatusCode.UNAVAILABLE,
                        "the session router is restarting or down "
                        f"({type(exc).__name__}); retry shortly",
                    )
                await asyncio.sleep(0.2)
