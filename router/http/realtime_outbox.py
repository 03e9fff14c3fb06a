"""``Outbox``: the server events of one Realtime connection waiting to be written, bounded.

Events are queued without waiting (a response streams while the socket is slow) and written in
order by ``drain``. A client that does not read lets them pile up: past ``MAX_OUTBOX_BYTES``
queued (or ``MAX_OUTBOX_EVENTS``), ``overflowed`` is set and the connection is dropped with
close code 1008, so one stalled reader holds at most that much memory.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

from starlette.websockets import WebSocket

MAX_OUTBOX_BYTES = 4 << 20
MAX_OUTBOX_EVENTS = 4096


class Outbox:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self._queued: deque[str] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self.overflowed = asyncio.Event()

    def put(self, event: dict[str, Any]) -> None:
        """Queue one event (never waits); past the bounds the connection is to be dropped and
        nothing more is queued."""
        if self.overflowed.is_set():
            return
        text = json.dumps(event, ensure_ascii=False)
        self._queued.append(text)
        self._bytes += len(text)
        if self._bytes > MAX_OUTBOX_BYTES or len(self._queued) > MAX_OUTBOX_EVENTS:
            self._queued.clear()
            self.overflowed.set()
        self._ready.set()

    async def drain(self) -> None:
        """Write queued events in order until cancelled (or the socket fails)."""
        while True:
            await self._ready.wait()
            while self._queued:
                text = self._queued[0]
                await self.websocket.send_text(text)
                if self._queued and self._queued[0] is text:
                    self._queued.popleft()
                    self._bytes -= len(text)
            self._ready.clear()

    async def flush(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until everything queued has been written."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._queued and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
