"""``next_ref`` (and ``refs``, the store's loop over it) reads a Ray streaming call item by
item, and takes an item that Ray's async read slept through (the read still waiting, the item
ready) within ``RECHECK_S``.

The first test reads a real streaming actor call to its end. The second makes the missed
wake-up happen: Ray's miss cannot be caused on purpose, so its stream is a stand-in whose
pending read never wakes although its next item is ready, as the checkpoint store's read was
seen to under load; before ``next_ref`` that read waited until some later event (10 s and more).
The third misses the wake-up at a real stream's end, read in an async actor as the store reads:
``next_ready()`` is False there, so before ``refs`` watched the task's completion the read
waited for good, and the check itself made a blocking ``ray.get`` in the actor's event loop.
"""

from __future__ import annotations

import asyncio
import time

import ray

from replica.actor.stream_reads import RECHECK_S, next_ref, refs

ITEMS = 3


@ray.remote
class Counter:
    async def count(self, n: int):
        for i in range(n):
            await asyncio.sleep(0.01 if i % 2 else 0.3)  # gaps longer than RECHECK_S too
            yield i


def test_a_real_stream_is_read_in_order_to_its_end(ray_cluster):
    async def read_all() -> list[int]:
        stream = Counter.remote().count.options(_generator_backpressure_num_objects=1).remote(5)
        return [await ref async for ref in refs(stream)]

    assert asyncio.run(read_all()) == [0, 1, 2, 3, 4]


class SleptThrough:
    """A stream whose first read never wakes, though its item is ready (``next_ready``)."""

    def __init__(self) -> None:
        self.reads = 0
        self.cancelled = False

    def next_ready(self) -> bool:
        return True

    async def __anext__(self) -> str:
        self.reads += 1
        if self.reads == 1:
            try:
                await asyncio.Event().wait()  # the wake-up that never comes
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        return "item"


def test_an_item_the_read_slept_through_is_taken_within_the_recheck():
    stream = SleptThrough()

    async def read() -> tuple[str, float]:
        start = time.monotonic()
        ref = await next_ref(stream)
        await asyncio.sleep(0)  # the sleeping read's cancellation lands
        return ref, time.monotonic() - start

    ref, waited = asyncio.run(read())
    assert ref == "item" and stream.reads == 2 and stream.cancelled
    assert waited < RECHECK_S + 0.5


class SleepsAtEnd:
    """A real stream of ``ITEMS`` items whose first read of its end never wakes."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.taken = 0
        self.slept = False

    def completed(self):
        return self.stream.completed()

    def next_ready(self) -> bool:
        return self.stream.next_ready()

    async def __anext__(self):
        if self.taken == ITEMS and not self.slept:
            self.slept = True
            await asyncio.sleep(3600)  # the wake-up at the end that never comes
        ref = await self.stream.__anext__()
        self.taken += 1
        return ref


@ray.remote
class StreamReader:
    async def read_to_the_end(self, counter) -> tuple[list[int], bool]:
        """The items of ``counter``'s stream read with ``refs``, and whether Ray saw a blocking
        ``ray.get`` in this actor's event loop."""
        import ray._private.worker as ray_worker

        stream = SleepsAtEnd(counter.count.remote(ITEMS))

        async def read_all() -> list[int]:
            return [await ref async for ref in refs(stream, recheck_s=0.05)]

        items = await asyncio.wait_for(read_all(), timeout=20)
        return items, ray_worker.blocking_get_inside_async_warned


def test_a_read_that_sleeps_through_the_stream_end_ends_without_blocking(ray_cluster):
    items, blocked = ray.get(StreamReader.remote().read_to_the_end.remote(Counter.remote()))
    assert items == list(range(ITEMS))
    assert not blocked
