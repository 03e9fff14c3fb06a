"""``refs``: the items of a replica actor's streaming call (a checkpoint store's checkpoints),
each read so that a missed wake-up costs at most ``RECHECK_S``.

Ray's async read of a streaming call (``async for ref in stream``) can stay asleep after the
item it waits for has arrived: seen under load on the checkpoint store's stream (the item ready
in the store's process, ``next_ready()`` True, the read still waiting until some later event
woke it, 10 s and more). A checkpoint store reads one item at a time and then often nothing for
long, so such an item was a drop whose acknowledgement never came: the replica's ``checkpoints``
pool showed a released session's checkpoint held. Every read is therefore kept waiting (one
wait for the whole gap, so an idle stream costs nothing) and checked every ``RECHECK_S``: an
item found ready while the read still sleeps is taken at once.

A read can sleep through the stream's end the same way, and ``next_ready()`` cannot tell then
(it is False at the end, and on a finished stream it makes a blocking ``ray.get``, which an
async actor reports as blocking its event loop). So ``refs`` also watches the streaming task's
completion: once the task has ended, everything it produced is at hand, and a read still
asleep after that is replaced by a fresh one, which returns the next item or the end at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ray.exceptions import RayError

log = logging.getLogger(__name__)

RECHECK_S = 0.2


async def ended(stream: Any) -> None:
    """Returns when ``stream``'s task has ended, whether it returned or failed (its failure is
    the stream's last item, read as any other)."""
    with contextlib.suppress(RayError):
        await stream.completed()


async def next_ref(
    stream: Any, task_ended: asyncio.Future | None = None, recheck_s: float = RECHECK_S
) -> Any:
    """The reference of ``stream``'s next item (an ``ObjectRefGenerator``); raises
    ``StopAsyncIteration`` at its end, as ``__anext__`` does. ``task_ended``: done once the
    streaming task has ended (``ended``)."""
    read = asyncio.ensure_future(stream.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({read}, timeout=recheck_s)
            if done:
                return read.result()
            if task_ended is not None and task_ended.done():
                late = "the stream's next item or its end"
            elif stream.next_ready():
                late = "an item"
            else:
                continue
            # the read slept through it: take it here (what is ready is read without waiting;
            # the sleeping read is cancelled before it can take anything)
            read.cancel()
            log.info("a stream read slept through %s: taken %.1f s late at most", late, recheck_s)
            return await stream.__anext__()
    finally:
        if not read.done():
            read.cancel()


async def refs(stream: Any, recheck_s: float = RECHECK_S) -> AsyncIterator[Any]:
    """``stream``'s item references in order, each read with ``next_ref``."""
    task_ended = asyncio.ensure_future(ended(stream))
    try:
        while True:
            try:
                yield await next_ref(stream, task_ended, recheck_s)
            except StopAsyncIteration:
                return
    finally:
        task_ended.cancel()
