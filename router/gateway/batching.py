"""``CallBatcher``: calls of one kind to one actor, batched by flow control, not by timers.

A request that finds fewer than ``max_in_flight`` calls in flight goes at once, alone. Requests
that arrive while that many are in flight wait for one to return, then go together in the next
call: under load, one actor call (one message, one command on the replica's engine thread)
carries many requests; when idle, no request waits for another. With ``max_in_flight`` 2 a
request that arrives just after a call went out does not wait for that call's round trip (a
turn submitted behind a batch in flight would pay up to two); the calls in flight are
independent, so requests whose order matters must not share such a batcher.
``send(requests)`` returns one result per request, in order, or one ``ActorError`` for all of
them; if it raises, every request of the batch gets the exception.

A request's caller may be cancelled while its request is in flight; the request still runs (an
actor call cannot be taken back), and ``submit`` returns a task the caller can hand to a cleanup
that awaits the result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from replica.api import ActorError

Send = Callable[[list[Any]], Awaitable[Sequence[Any] | ActorError]]


class CallBatcher:
    def __init__(self, send: Send, max_in_flight: int = 1) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._send = send
        self._max_in_flight = max_in_flight
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._senders: set[asyncio.Task] = set()  # each sends one call at a time
        # calls sent and the requests they carried (requests_sent / calls_sent: the batch size)
        self.calls_sent = 0
        self.requests_sent = 0

    def submit(self, request: Any) -> asyncio.Future:
        """Queue ``request``; the future of its result (cancelling it does not take it back)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        future.add_done_callback(_retrieved)  # a cancelled caller's exception is not an error
        self._waiting.append((request, future))
        if len(self._senders) < self._max_in_flight:
            self._senders.add(loop.create_task(self._run()))
        return future

    async def call(self, request: Any) -> Any:
        """``request``'s result, or the exception of its batch's call."""
        return await asyncio.shield(self.submit(request))

    async def _run(self) -> None:
        try:
            await self._send_waiting()
        finally:  # at once, not in a done callback: a request queued meanwhile starts a sender
            self._senders.discard(asyncio.current_task())

    async def _send_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            self.calls_sent += 1
            self.requests_sent += len(batch)
            try:
                results = await self._send([request for request, _ in batch])
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - every caller of the batch gets it
                for _, future in batch:
                    _settle(future, exception=exc)
                continue
            if isinstance(results, ActorError):
                results = [results] * len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                _settle(future, result)


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _settle(future: asyncio.Future, result: Any = None, exception: Exception | None = None) -> None:
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
