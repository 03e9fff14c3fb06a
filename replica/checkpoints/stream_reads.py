"""``next_ref``: the next item of a Ray streaming call, read so that a missed wake-up costs at
most ``RECHECK_S``.

Ray's async read of a streaming call (``async for ref in stream``) can stay asleep after the
item it waits for has arrived: seen under load on the checkpoint store's stream (the item ready
in the store's process, ``next_ready()`` True, the read still waiting until some later event
woke it, 10 s and more). A checkpoint store reads one item at a time and then often nothing for
long, so such an item was a drop whose acknowledgement never came: the replica's ``checkpoints``
pool showed a released session's checkpoint held. The read is therefore kept waiting (one wait
for the whole gap, so an idle stream costs nothing) and checked every ``RECHECK_S``: an item
found ready while the read still sleeps is taken at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger(__name__)

RECHECK_S = 0.2


async def next_ref(stream: Any, recheck_s: float = RECHECK_S) -> Any:
    """The reference of ``stream``'s next item (an ``ObjectRefGenerator``); raises
    ``StopAsyncIteration`` at its end, as ``__anext__`` does."""
    read = asyncio.ensure_future(stream.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({read}, timeout=recheck_s)
            if done:
                return read.result()
            if stream.next_ready():
                # the read slept through its item: take it here (a ready item is read without
                # waiting; the sleeping read is cancelled before it can take anything)
                read.cancel()
                log.info(
                    "a stream read slept through its item: taken %.1f s late at most", recheck_s
                )
                return await stream.__anext__()
    finally:
        if not read.done():
            read.cancel()


async def refs(stream: Any) -> AsyncIterator[Any]:
    """``stream``'s item references in order, each read with ``next_ref``."""
    while True:
        try:
            yield await next_ref(stream)
        except StopAsyncIteration:
            return
