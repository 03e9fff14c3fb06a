"""The floors under the Realtime barge-in latencies, measured in the same run on the same box.

A cancel is one actor call to the replica (``interrupt``) and then the interrupted turn's end
on the gateway's long-lived output stream; a restart one actor call (the submit, with the chat
rendered in it) and then its first token on that stream; both begin and end with a WebSocket
message between the client and the gateway. So, beside the benchmark's sockets:

- ``EchoStream``: an actor that does only that shape of work, no engine: a call (``poke``)
  answered at once, and an item of the same shape as a turn's end (a list of one
  ``TurnEvent``) put on a streaming call that the bench process holds open (``stream``). The
  time from the call sent to that item taken is the floor of a cancel's replica hops.
- ``ws_round_trip``: a ``conversation.item.retrieve`` on a benchmark socket, answered by the
  gateway without a replica: the floor of a client's event and the gateway's answer.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import ray

from replica.api import FinishReason, TurnEvent


@ray.remote(num_cpus=0)
class EchoStream:
    """A call and a stream item, nothing else (see the module's docstring)."""

    def __init__(self) -> None:
        self._items: asyncio.Queue | None = None

    def _queue(self) -> asyncio.Queue:
        if self._items is None:
            self._items = asyncio.Queue()
        return self._items

    async def poke(self, session_id: str) -> bool:
        end = TurnEvent(session_id, 1, (), "", FinishReason.INTERRUPTED, 100)
        self._queue().put_nowait([end])
        return True

    async def stream(self):
        while True:
            yield await self._queue().get()


class EchoStreamClient:
    """The typed calls of an ``EchoStream``."""

    def __init__(self, handle) -> None:
        self.handle = handle

    async def poke(self, session_id: str) -> bool:
        return await self.handle.poke.remote(session_id)

    def stream(self):
        return self.handle.stream.remote()


async def echo_floor(calls: list[float], items: list[float], tick_s: float = 0.02) -> None:
    """Every ``tick_s`` until cancelled: an ``EchoStream``'s call round trip (ms, ``calls``)
    and the time from the call sent to its item taken off the stream (ms, ``items``)."""
    echo = EchoStreamClient(EchoStream.remote())
    waiting: dict[str, asyncio.Future] = {}

    async def pump() -> None:
        async for ref in echo.stream():
            for event in await ref:
                future = waiting.pop(event.session_id, None)
                if future is not None and not future.done():
                    future.set_result(time.perf_counter())

    pumping = asyncio.ensure_future(pump())
    try:
        for i in itertools.count():
            key = f"echo-{i}"
            arrived = waiting[key] = asyncio.get_running_loop().create_future()
            start = time.perf_counter()
            await echo.poke(key)
            called = time.perf_counter()
            taken = await arrived
            if i > 0:  # the first call waits for the actor to start
                calls.append((called - start) * 1000)
                items.append((taken - start) * 1000)
            await asyncio.sleep(tick_s)
    finally:
        pumping.cancel()
        ray.kill(echo.handle)


async def ws_round_trip(conn, item_id: str) -> float:
    """A ``conversation.item.retrieve`` of ``item_id`` to its answer, on an idle socket (ms)."""
    start = time.perf_counter()
    await conn.conversation.item.retrieve(item_id=item_id)
    async for event in conn:
        if event.type == "conversation.item.retrieved":
            return (time.perf_counter() - start) * 1000
        if event.type == "error":
            raise RuntimeError(event.error.message)
    raise RuntimeError("the socket closed")
