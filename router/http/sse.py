"""Server-sent events as the OpenAI API streams them: ``data: JSON`` lines (Responses also name
the ``event``), a failure after the first event sent as an ``error`` event, then the end."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from router.http.errors import ApiError


def data(payload: dict[str, Any], event: str | None = None) -> bytes:
    line = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {line}\n\n".encode()


DONE = b"data: [DONE]\n\n"


async def guarded(
    events: AsyncGenerator[bytes, None], named: bool = False
) -> AsyncGenerator[bytes, None]:
    """``events``, ending with an error event if they fail midway (the status line is sent);
    closing this closes ``events``."""
    try:
        async for event in events:
            yield event
    except ApiError as exc:
        body = exc.body()
        if named:  # Responses: an ``error`` event carries the error's fields at top level
            yield data({"type": "error", **body["error"]}, "error")
        else:
            yield data(body)
    finally:
        await events.aclose()


class EventStream:
    """A streamed answer, started: ``start`` runs the events to their first one while the
    request is still being handled, so the generator's ``finally`` (which ends its turn and lets
    its session go) is certain to run — at the end, or at ``aclose`` when the response ends
    early, even when the client left before the first byte was sent (a generator never started
    runs no ``finally``). Iterate it once; ``aclose`` is idempotent."""

    def __init__(self, first: bytes | None, events: AsyncGenerator[bytes, None]) -> None:
        self._first, self._events = first, events

    @classmethod
    async def start(cls, events: AsyncGenerator[bytes, None]) -> EventStream:
        try:
            return cls(await anext(events), events)
        except StopAsyncIteration:
            return cls(None, events)

    async def __aiter__(self) -> AsyncGenerator[bytes, None]:
        if self._first is not None:
            yield self._first
        async for event in self._events:
            yield event

    async def aclose(self) -> None:
        await self._events.aclose()
