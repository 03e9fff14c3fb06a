"""The CPU each side of a comparison spends per unit of work (a lifecycle, a token), by process
group, and the cores it kept busy: on a box whose cores every process shares, a side that keeps
them all busy runs at (cores ÷ CPU per unit), so two such sides' rates stand in the inverse
ratio of their CPU per unit, and the table says where each side's goes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from bench.harness.cpu import CpuMeter
from bench.harness.report import Table

Result = TypeVar("Result")


class SideCosts:
    def __init__(self, cpu: CpuMeter) -> None:
        self.cpu = cpu
        self.used: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(cpu.groups, 0.0))
        self.units: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    async def run(
        self, side: str, work: Awaitable[Result], units: Callable[[Result, float], float]
    ) -> Result:
        """Await ``work`` for ``side``, metering the CPU of every group and the wall time;
        ``units(result, wall)`` is how much work it did (lifecycles: rate × wall)."""
        before, start = self.cpu.sample(), time.perf_counter()
        result = await work
        wall = time.perf_counter() - start
        for group, seconds in CpuMeter.delta(before, self.cpu.sample()).items():
            self.used[side][group] += seconds
        self.wall[side] += wall
        self.units[side] += units(result, wall)
        return result

    def per_unit_ms(self, side: str) -> float:
        """CPU milliseconds per unit of ``side``, every group."""
        return 1000 * sum(self.used[side].values()) / self.units[side]

    def cores(self, side: str) -> float:
        """The cores ``side`` kept busy on average (CPU seconds per wall second)."""
        return sum(self.used[side].values()) / self.wall[side]

    def print(self, unit: str, sides: list[str], scale: float = 1000.0, label: str = "ms") -> None:
        """CPU per ``unit`` (seconds × ``scale``, shown as ``label``) by group, for ``sides``."""
        groups = [g for g in self.cpu.groups if any(self.used[s][g] > 0 for s in sides)]
        table = Table("side", "cores busy", f"CPU {label} per {unit}", *groups)
        for side in sides:
            n = self.units[side]
            table.add(
                side,
                f"{self.cores(side):.2f}",
                f"{self.per_unit_ms(side) * scale / 1000:.2f}",
                *(f"{scale * self.used[side][g] / n:.2f}" for g in groups),
            )
        table.print()
