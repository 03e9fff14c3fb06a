"""Statistics of benchmark samples: percentiles of latencies, and the spread of a figure
measured in several repetitions (min / median / max)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: int) -> float:
    """The ``q``-th percentile (1..99) of ``values`` by ``statistics.quantiles`` (inclusive
    method: interpolated between the samples, never outside them); NaN without samples."""
    if not 1 <= q <= 99:
        raise ValueError(f"percentile must be within 1..99, got {q}")
    if len(values) < 2:
        return float(values[0]) if values else math.nan
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def p50(values: Sequence[float]) -> float:
    return percentile(values, 50)


def p99(values: Sequence[float]) -> float:
    return percentile(values, 99)


@dataclass(frozen=True)
class Spread:
    """One figure over repetitions of a measurement: its median, and its min and max."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(math.nan, math.nan, math.nan)
        return cls(statistics.median(finite), min(finite), max(finite))

    def format(self, spec: str = ".2f", unit: str = "") -> str:
        """``1.23`` for one repetition, ``1.23 (1.10–1.40)`` for several; ``-`` for none."""
        if math.isnan(self.median):
            return "-"
        text = f"{self.median:{spec}}{unit}"
        if self.low != self.high:
            text += f" ({self.low:{spec}}–{self.high:{spec}})"
        return text


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
    """The spread of per-repetition ratios: repetition i divides ``numerators[i]`` by
    ``denominators[i]``, both measured side by side in that repetition."""
    if len(numerators) != len(denominators):
        raise ValueError("one numerator per denominator")
    return Spread.of(n / d if d else math.nan for n, d in zip(numerators, denominators))
