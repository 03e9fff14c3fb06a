"""The benchmarks' closed loop measures lifecycles/s by Little's law, which workers in lockstep
cannot skew: their lifecycles end in waves, and a count of the lifecycles that end in a window
holds a whole number of waves (the Serve peer's 76.8 and 102.4 lifecycles/s were 3 and 4 waves of
64 in 2.5 s). Here the real ``closed_loop`` runs workers whose lifecycles all end on the ticks of
one clock, so the true rate is known: the workers over the tick."""

from __future__ import annotations

import asyncio
import math
import time

from bench.harness.load import closed_loop
from bench.harness.window import LifecycleSamples
from bench.harness.workload import Lifecycle

WORKERS = 8
TICK_S = 0.3  # every lifecycle ends on a tick: waves of WORKERS every TICK_S
SECONDS = 1.0  # a window of 3.33 ticks: 3 or 4 waves, never the true rate's 3.33


async def test_lockstep_waves_are_measured_at_their_rate() -> None:
    epoch = time.perf_counter()
    ends: list[float] = []

    async def lifecycle() -> Lifecycle:
        start = time.perf_counter()
        ticks = math.floor((start - epoch) / TICK_S) + 1
        await asyncio.sleep(epoch + ticks * TICK_S - start)
        end = time.perf_counter()
        ends.append(end)
        return Lifecycle(start, start, end, end, 8)

    samples = await closed_loop(lifecycle, WORKERS, SECONDS, warmup=0.1)
    true_rate = WORKERS / TICK_S
    assert samples.count >= 3 * WORKERS and samples.count % WORKERS == 0  # whole waves
    assert abs(samples.rate - true_rate) / true_rate < 0.05, samples.rate
    # what a count over the window gives instead: a whole number of waves over its length
    by_count = samples.count / SECONDS
    assert abs(by_count - true_rate) / true_rate > 0.09, by_count


def test_merged_windows_pool_their_lifecycles() -> None:
    a, b = LifecycleSamples(4), LifecycleSamples(4)
    for samples, seconds in ((a, 0.5), (a, 0.5), (b, 1.5)):
        samples.add(Lifecycle(0.0, 0.1, 0.2, seconds, 8))
    merged = LifecycleSamples.merged([a, b])
    assert merged.count == 3
    assert merged.rate == 4 * 3 / 2.5  # 4 workers over a mean lifecycle of 2.5 / 3 s
    assert sorted(merged.total_ms) == [500.0, 500.0, 1500.0]
