"""The CPU one item of a long-lived Ray streaming call costs its two processes, nothing else.

A replica sends each session checkpoint to its store as one item of such a call, with a
backpressure of one item (``ReplicaClient.checkpoint_stream``), and each gateway's outputs as
items of another (``ReplicaActor.stream_outputs``); whatever the replica and its reader do
besides, each item costs at least this. ``StreamProducer`` yields items made by ``make_item``
(``CheckpointItem``: a list of one ``SessionStates`` with ``nbytes`` of raw state; ``RowsItem``:
one entry of ``rows`` token rows, as the replica sends a gateway) at a given rate to a
``StreamConsumer`` that takes them as the store and the gateway do (``await ref``); both
processes' CPU is read from /proc over the run, less what each spends idle over the same time.
``PlainStreamProducer`` yields them from a plain generator on a thread of its own instead.
``SocketProducer`` sends them over a checkpoint socket (``replica.actor.checkpoint_socket``, the
address handed out through Ray) to a ``CheckpointSocketReader`` in the consumer, as a replica
sends its store its checkpoints when it can (the Ray stream is that path's fallback).
"""

from __future__ import annotations

import asyncio
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from replica.actor.checkpoint_socket import CheckpointSocket
from replica.actor.tasks import BackgroundTasks
from replica.api import STATE_FORMAT, OutputAddress, SessionMeta, SessionStates
from replica.checkpoints.socket_reader import CheckpointSocketReader


@dataclass(frozen=True)
class ItemCost:
    producer_ms: float  # CPU per item in the producing process
    consumer_ms: float  # ... and in the consuming one

    @property
    def total_ms(self) -> float:
        return self.producer_ms + self.consumer_ms


@dataclass(frozen=True)
class CheckpointItem:
    """A checkpoint as the replica streams it to its store: one session's state of ``nbytes``."""

    nbytes: int = 28_416

    def __call__(self, i: int) -> list[SessionStates]:
        meta = SessionMeta(f"session-{i}", "", 60.0, 100 + i, (), 0.0, 100)
        raw = [np.zeros(self.nbytes // 4, np.uint8) for _ in range(4)]
        return [SessionStates(STATE_FORMAT, "floor", "float32", "float32", (meta,), *raw)]


@dataclass(frozen=True)
class RowsItem:
    """A gateway's outputs item: one entry of ``rows`` token rows (``replica.api.TokenRows``:
    session ids, turn ids, token ids, texts), one row per session of a decode step."""

    rows: int

    @property
    def session_ids(self) -> list[str]:
        return [f"{s:032x}" for s in range(self.rows)]

    def __call__(self, i: int) -> list[tuple[list[str], list[int], list[int], list[str]]]:
        return [(self.session_ids, [i] * self.rows, list(range(self.rows)), ["ab"] * self.rows)]


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def produce(
    put: Callable[[list | None], None], count: int, rate: float, make_item: Callable[[int], list]
) -> None:
    """``count`` items made by ``make_item`` to ``put`` at ``rate`` a second, then None."""
    start = time.monotonic()
    for i in range(count):
        put(make_item(i))
        await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))
    put(None)


@ray.remote(num_cpus=0)
class StreamProducer:
    """Its stream is an async generator on the event loop, as the replica's checkpoint stream
    is (and a gateway's output stream when the replica has no stream thread free)."""

    def __init__(self) -> None:
        self.items: asyncio.Queue = asyncio.Queue()

    def pid(self) -> int:
        return os.getpid()

    async def stream(self):
        while (item := await self.items.get()) is not None:
            yield item

    async def produce(self, count: int, rate: float, make_item: Callable[[int], list]) -> None:
        await produce(self.items.put_nowait, count, rate, make_item)


@ray.remote(num_cpus=0, concurrency_groups={"stream": 1})
class PlainStreamProducer:
    """Its stream is a plain generator on a thread of its own (a concurrency group of this async
    actor), fed from the event loop through a ``queue.SimpleQueue``: as a replica streams a
    gateway's outputs (``replica.actor.stream_threads``)."""

    def __init__(self) -> None:
        self.items: queue.SimpleQueue = queue.SimpleQueue()

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="stream")
    def stream(self):
        while (item := self.items.get()) is not None:
            yield item

    async def produce(self, count: int, rate: float, make_item: Callable[[int], list]) -> None:
        await produce(self.items.put, count, rate, make_item)


@ray.remote(num_cpus=0)
class SocketProducer:
    """Its items go over a checkpoint socket of its own on loopback (``open``: the address for
    one reader), one at a time, each once the reader said it was taken."""

    def __init__(self) -> None:
        self.items: asyncio.Queue = asyncio.Queue()
        self.socket: CheckpointSocket | None = None

    def pid(self) -> int:
        return os.getpid()

    async def open(self) -> OutputAddress:
        self.socket = CheckpointSocket("127.0.0.1", BackgroundTasks())
        return self.socket.open(self._stream)

    async def _stream(self):
        while (item := await self.items.get()) is not None:
            yield item

    async def produce(self, count: int, rate: float, make_item: Callable[[int], list]) -> None:
        await produce(self.items.put_nowait, count, rate, make_item)


@ray.remote(num_cpus=0)
class StreamConsumer:
    def pid(self) -> int:
        return os.getpid()

    async def consume(self, producer) -> int:
        taken = 0
        stream = producer.stream.options(_generator_backpressure_num_objects=1).remote()
        async for ref in stream:
            taken += len(await ref)
        return taken

    async def consume_socket(self, address: OutputAddress) -> int:
        taken = 0
        reader = await CheckpointSocketReader.connect(address)
        async for entries in reader.items():
            taken += len(entries)
        return taken


async def stream_item_cost(
    rate: float = 50.0,
    seconds: float = 8.0,
    make_item: Callable[[int], list] = CheckpointItem(),
    producer_class: Any = StreamProducer,
) -> ItemCost:
    """``ItemCost`` of one item, at ``rate`` items/s for ``seconds`` (Ray must be initialised),
    from a ``producer_class`` actor (``StreamProducer``, ``PlainStreamProducer`` or
    ``SocketProducer``)."""
    producer, consumer = producer_class.remote(), StreamConsumer.remote()
    try:
        pids = await asyncio.gather(producer.pid.remote(), consumer.pid.remote())
        before, t0 = [process_cpu_s(p) for p in pids], time.monotonic()
        await asyncio.sleep(seconds / 2)
        idle = [(process_cpu_s(p) - b) / (time.monotonic() - t0) for p, b in zip(pids, before)]
        count = int(rate * seconds)
        before, t0 = [process_cpu_s(p) for p in pids], time.monotonic()
        if producer_class is SocketProducer:
            taking = consumer.consume_socket.remote(await producer.open.remote())
        else:
            taking = consumer.consume.remote(producer)
        await producer.produce.remote(count, rate, make_item)
        if await taking != count:
            raise RuntimeError("the floor's consumer missed items")
        spent = time.monotonic() - t0
        per_item = [
            (process_cpu_s(p) - b - i * spent) / count * 1e3 for p, b, i in zip(pids, before, idle)
        ]
        return ItemCost(*per_item)
    finally:  # the bare pair goes, whatever the measure ended with
        for actor in (producer, consumer):
            ray.kill(actor)
