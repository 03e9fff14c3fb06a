"""Server-sent events as the OpenAI API streams them: ``data: JSON`` lines (Responses also name
the ``event``), a failure after the first event sent as an ``error`` event, then the end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from router.http.errors import ApiError


def data(payload: dict[str, Any], event: str | None = None) -> bytes:
    line = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {line}\n\n".encode()


DONE = b"data: [DONE]\n\n"


async def guarded(events: AsyncIterator[bytes], named: bool = False) -> AsyncIterator[bytes]:
    """``events``, ending with an error event if they fail midway (the status line is sent)."""
    try:
        async for event in events:
            yield event
    except ApiError as exc:
        body = exc.body()
        if named:  # Responses: an ``error`` event carries the error's fields at top level
            yield data({"type": "error", **body["error"]}, "error")
        else:
            yield data(body)
