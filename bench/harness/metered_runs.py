"""Token runs of several paths measured side by side, each with the CPU seconds every process
group spent during it (``CpuMeter``), and the CPU-per-1,000-tokens table they make."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

from bench.harness.cpu import CpuMeter
from bench.harness.report import Table
from bench.harness.workload import TokenRounds


class MeteredRuns:
    def __init__(self, cpu: CpuMeter, paths: Sequence[str]) -> None:
        self.cpu, self.paths = cpu, tuple(paths)
        self.runs: dict[str, list[TokenRounds]] = defaultdict(list)
        self.used = {path: dict.fromkeys(cpu.groups, 0.0) for path in self.paths}

    async def run(self, path: str, work: Callable[[], Awaitable[TokenRounds]]) -> None:
        """One run of ``path``: its rounds, and the CPU each group spent meanwhile."""
        before = self.cpu.sample()
        self.runs[path].append(await work())
        for group, seconds in CpuMeter.delta(before, self.cpu.sample()).items():
            self.used[path][group] += seconds

    def rates(self, path: str) -> list[float]:
        return [run.rate for run in self.runs[path]]

    def print_cpu(self) -> None:
        print(
            "\nCPU seconds per 1,000 tokens by process group, all rounds of all runs (wall: "
            "seconds per 1,000 tokens; 2 cores give 2 CPU-s per wall second)"
        )
        table = Table("path", *self.cpu.groups, "total", "wall")
        for path in self.paths:
            thousands = sum(run.tokens for run in self.runs[path]) / 1000
            wall = sum(s for run in self.runs[path] for _, s in run.rounds)
            per = [self.used[path][group] / thousands for group in self.cpu.groups]
            table.add(path, *(f"{v:.2f}" for v in per), f"{sum(per):.2f}",
                      f"{wall / thousands:.2f}")  # fmt: skip
        table.print()
