"""Load generation: a closed loop of lifecycles, sequential call latencies, and calls per second
with a fixed number of calls in flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from bench.harness.window import LifecycleSamples, Window
from bench.harness.workload import Lifecycle

ERROR_PAUSE_S = 0.01  # a worker whose lifecycle failed waits this long before the next


async def closed_loop(
    lifecycle: Callable[[], Awaitable[Lifecycle]],
    concurrency: int,
    seconds: float,
    warmup: float,
) -> LifecycleSamples:
    """``concurrency`` workers each run ``lifecycle`` back to back (a new one as soon as the last
    ends) until the window closes (``Window``); each worker finishes the lifecycle it is in, so
    every session is closed. Failures are counted by name, not raised."""
    window = Window(concurrency, seconds, warmup)

    async def worker() -> None:
        first = True
        while window.running():
            try:
                record = await lifecycle()
            except Exception as exc:  # noqa: BLE001 - counted and shown in the table
                window.error(exc)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            window.add(record, first)
            first = False

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return window.samples


async def sequential_ms(call: Callable[[], Awaitable[object]], count: int) -> list[float]:
    """Latencies in ms of ``count`` calls made one after another (concurrency 1), after
    ``count // 10`` more that warm up and are not kept."""
    samples = []
    for i in range(count + count // 10):
        t0 = time.perf_counter()
        await call()
        if i >= count // 10:
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


async def calls_per_second(
    call: Callable[[], Awaitable[object]], in_flight: int, total: int
) -> float:
    """Throughput of ``call`` with ``in_flight`` callers each making ``total // in_flight`` calls
    back to back, after one warm-up call per caller."""
    per_caller = max(1, total // in_flight)

    async def caller() -> None:
        for _ in range(per_caller):
            await call()

    await asyncio.gather(*(call() for _ in range(in_flight)))
    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    return per_caller * in_flight / (time.perf_counter() - t0)
