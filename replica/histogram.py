"""``LatencyHistogram``: durations observed in fixed buckets inside a replica, handed out as the
picklable ``HistogramCounts`` that the metrics exporter turns into a Prometheus histogram."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from replica.api import HistogramCounts


class LatencyHistogram:
    """Observed durations in fixed buckets (the replica's side of a Prometheus histogram)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.total = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        self._counts[bisect.bisect_left(self.bounds, seconds)] += times
        self.total += seconds * times

    def counts(self) -> HistogramCounts:
        cumulative, running = [], 0
        for n in self._counts[:-1]:
            running += n
            cumulative.append(running)
        return HistogramCounts(self.bounds, tuple(cumulative), sum(self._counts), self.total)
