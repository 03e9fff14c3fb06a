"""Which lifecycles of a closed loop are measured, and what is kept of them.

Workers start one after another and the first lifecycles run on cold paths, so the window opens
``warmup`` seconds after every worker has finished its first lifecycle. It lasts ``seconds``, or
two first-lifecycle latencies when those are longer (at most ``2 * seconds``), so that slow cells
still count whole lifecycles. A lifecycle counts when it ends inside the window.

The rate is Little's law for a closed loop: the workers over the mean lifecycle of the window.
A count over the window's length is not: workers that run in lockstep (their calls batched
together, their turns ending in the same step) end their lifecycles in waves, and a window
holds a whole number of waves, so that count moved by a wave (a third of the rate at 3 waves a
window) with where the window fell; the mean lifecycle does not.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.harness.stats import p50, p99
from bench.harness.workload import Lifecycle

GIVE_UP_S = 60.0  # a window that never opens (workers keep failing) opens after this long


@dataclass
class LifecycleSamples:
    """The lifecycles that ended inside one window (or several, merged) of a closed loop of
    ``concurrency`` workers: their count, latencies in ms (whole and per phase), tokens per turn
    seen, errors."""

    concurrency: int = 0
    count: int = 0
    total_ms: list[float] = field(default_factory=list)
    open_ms: list[float] = field(default_factory=list)
    turn_ms: list[float] = field(default_factory=list)
    close_ms: list[float] = field(default_factory=list)
    tokens_per_turn: set[int] = field(default_factory=set)
    errors: Counter = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        """Lifecycles per second: the workers over the mean lifecycle (Little's law; each worker
        starts its next lifecycle as its last ends). Failed lifecycles are not in the mean: a
        run with errors says so in its table."""
        busy_s = sum(self.total_ms) / 1e3
        return self.concurrency * self.count / busy_s if busy_s else 0.0

    @property
    def p50_ms(self) -> float:
        return p50(self.total_ms)

    @property
    def p99_ms(self) -> float:
        return p99(self.total_ms)

    def add(self, lifecycle: Lifecycle) -> None:
        t0, t1, t2, t3, tokens = lifecycle
        self.count += 1
        self.total_ms.append((t3 - t0) * 1e3)
        self.open_ms.append((t1 - t0) * 1e3)
        self.turn_ms.append((t2 - t1) * 1e3)
        self.close_ms.append((t3 - t2) * 1e3)
        self.tokens_per_turn.add(tokens)

    @classmethod
    def merged(cls, parts: Sequence[LifecycleSamples]) -> LifecycleSamples:
        """Several windows of the same loop pooled: the rate and percentiles over all."""
        out = cls()
        for part in parts:
            out.concurrency = part.concurrency
            out.count += part.count
            out.total_ms += part.total_ms
            out.open_ms += part.open_ms
            out.turn_ms += part.turn_ms
            out.close_ms += part.close_ms
            out.tokens_per_turn |= part.tokens_per_turn
            out.errors.update(part.errors)
        return out


class Window:
    """The measurement window of one closed-loop run of ``concurrency`` workers; feed it every
    finished lifecycle (``add``) and failure (``error``) and run while ``running()``."""

    def __init__(self, concurrency: int, seconds: float, warmup: float) -> None:
        self.concurrency, self.seconds, self.warmup = concurrency, seconds, warmup
        self.started = time.perf_counter()
        self.first_latencies: list[float] = []
        self.opens_at: float | None = None
        self.closes_at: float | None = None
        self.samples = LifecycleSamples(concurrency)

    def running(self) -> bool:
        now = time.perf_counter()
        if self.opens_at is None and now - self.started > GIVE_UP_S:
            self._open(now)
        return self.closes_at is None or now < self.closes_at

    def _open(self, now: float) -> None:
        longest_first = max(self.first_latencies, default=0.0)
        span = min(max(self.seconds, 2 * longest_first), 2 * self.seconds)
        self.opens_at = now + self.warmup
        self.closes_at = self.opens_at + span

    def add(self, lifecycle: Lifecycle, first: bool) -> None:
        """A finished lifecycle; ``first`` when it is its worker's first."""
        if first:
            self.first_latencies.append(lifecycle.closed - lifecycle.start)
            if len(self.first_latencies) == self.concurrency and self.opens_at is None:
                self._open(lifecycle.closed)
        if self.opens_at is not None and self.opens_at <= lifecycle.closed <= self.closes_at:
            self.samples.add(lifecycle)

    def error(self, exc: Exception) -> None:
        self.samples.errors[error_name(exc)] += 1


def error_name(exc: Exception) -> str:
    """A short name for a failure: the gRPC status code name, else the message or type."""
    code = getattr(exc, "code", None)  # grpc.aio.AioRpcError
    return code().name if callable(code) else str(exc) or type(exc).__name__
