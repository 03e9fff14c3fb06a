"""``DurableWaits``: callers waiting until sessions' checkpoints are stored (``CheckpointOutbox.
durable``: a session that arrived by migration is safe from its new replica's death once one
is). Used on the actor's event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class DurableWaits:
    def __init__(self) -> None:
        self._waits: list[tuple[set[str], asyncio.Future]] = []

    async def wait(self, session_ids: set[str], timeout_s: float) -> bool:
        """True once every one of ``session_ids`` is ``settle``d; False when ``timeout_s``
        passed first or ``fail_all`` ended the wait."""
        done = asyncio.get_running_loop().create_future()
        self._waits.append((set(session_ids), done))
        try:
            return await asyncio.wait_for(done, timeout_s)
        except asyncio.TimeoutError:
            return False

    def settle(self, *done_ids: Iterable[str]) -> None:
        """Waiters stop waiting for ``done_ids`` (stored, or released: nothing left to
        protect); those left waiting for none are done."""
        for waiting, done in self._waits:
            waiting.difference_update(*done_ids)
            if not waiting and not done.done():
                done.set_result(True)
        self._waits = [(w, f) for w, f in self._waits if not f.done()]

    def fail_all(self) -> None:
        """Nothing waited for will be stored (the store is gone): every wait ends, False."""
        for _, done in self._waits:
            if not done.done():
                done.set_result(False)
        self._waits = []
