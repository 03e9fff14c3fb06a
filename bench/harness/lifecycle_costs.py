"""What a session lifecycle costs each process, and how many requests each actor call carried:
the meter that shows where a gap between two paths' lifecycles/s comes from on a box whose cores
every process shares.

``LifecycleCosts.run(path, batchers, work)`` runs ``work`` (a closed loop of lifecycles) and
records, meanwhile, the CPU of every process group (``CpuMeter``), the calls and requests of
the path's call batchers (``router.gateway.batching.CallBatcher``) by kind: replica calls
(opens, submissions, closes) and router updates (pins, forgets), and the replicas' engine
forwards and their rows (``replica.api.StepStats``, summed over the replicas' snapshots). Costs
per lifecycle are over the run's whole wall time at the window's rate (``rate × wall``: warm-up
and the last lifecycles' ends included, in steady state the same).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import astuple, dataclass, field

from bench.harness.cpu import CpuMeter
from bench.harness.report import Table
from bench.harness.window import LifecycleSamples
from replica.api import StepStats
from router.gateway.batching import CallBatcher

Batchers = Callable[[], dict[str, list[CallBatcher]]]  # by kind: "replica", "router"
Steps = Callable[[], Awaitable[list[StepStats]]]  # each replica's forwards so far
KINDS = ("replica", "router")


@dataclass
class PathCost:
    lifecycles: float = 0.0  # rate × wall, summed over runs
    cpu: dict[str, float] = field(default_factory=dict)  # seconds by process group
    calls: dict[str, int] = field(default_factory=dict)  # actor calls by kind
    requests: dict[str, int] = field(default_factory=dict)  # the requests they carried
    steps: StepStats = StepStats()  # the replicas' forwards during the runs


def _counts(batchers: dict[str, list[CallBatcher]]) -> dict[str, tuple[int, int]]:
    return {
        kind: (
            sum(b.calls_sent for b in batchers.get(kind, ())),
            sum(b.requests_sent for b in batchers.get(kind, ())),
        )
        for kind in KINDS
    }


def _minus(a: StepStats, b: StepStats) -> StepStats:
    return StepStats(*(x - y for x, y in zip(astuple(a), astuple(b), strict=True)))


def _sum(stats: Iterable[StepStats]) -> StepStats:
    return StepStats(*map(sum, zip(*map(astuple, stats), strict=True)))


class LifecycleCosts:
    def __init__(self, cpu: CpuMeter, steps: Steps) -> None:
        self.cpu = cpu
        self.steps = steps
        self.paths: dict[str, PathCost] = {}

    async def run(
        self, path: str, batchers: Batchers, work: Awaitable[LifecycleSamples]
    ) -> LifecycleSamples:
        """One run of ``path``: awaits ``work`` (a coroutine not yet started); its samples, its
        costs added to the path's."""
        cost = self.paths.setdefault(path, PathCost())
        steps0 = _sum(await self.steps())
        cpu0, calls0, t0 = self.cpu.sample(), _counts(batchers()), time.perf_counter()
        samples = await work
        wall = time.perf_counter() - t0
        cpu1, calls1 = self.cpu.sample(), _counts(batchers())
        cost.steps = _sum([cost.steps, _minus(_sum(await self.steps()), steps0)])
        cost.lifecycles += samples.rate * wall
        for group, seconds in CpuMeter.delta(cpu0, cpu1).items():
            cost.cpu[group] = cost.cpu.get(group, 0.0) + seconds
        for kind in KINDS:
            cost.calls[kind] = cost.calls.get(kind, 0) + calls1[kind][0] - calls0[kind][0]
            cost.requests[kind] = cost.requests.get(kind, 0) + calls1[kind][1] - calls0[kind][1]
        return samples

    def print(self, title: str) -> None:
        print(f"\n{title}")
        groups = self.cpu.groups
        table = Table(
            "path",
            *(f"{g} ms" for g in groups),
            "total ms",
            *(f"{k} calls (requests each)" for k in KINDS),
            "decode steps (rows each)",
            "prefill steps (chunks each)",
        )
        for path, cost in self.paths.items():
            n = cost.lifecycles or 1.0
            per = [cost.cpu.get(g, 0.0) / n * 1e3 for g in groups]
            calls = [
                f"{cost.calls[k] / n:.3f} ({cost.requests[k] / max(cost.calls[k], 1):.1f})"
                for k in KINDS
            ]
            st = cost.steps
            forwards = [
                f"{steps / n:.3f} ({rows / max(steps, 1):.1f})"
                for steps, rows in (
                    (st.decode_steps_total, st.decode_rows_total),
                    (st.prefill_steps_total, st.prefill_rows_total),
                )
            ]
            table.add(path, *(f"{v:.2f}" for v in per), f"{sum(per):.2f}", *calls, *forwards)
        table.print()
        print(
            "  CPU ms of each process group per lifecycle; actor calls per lifecycle of this "
            "process's batchers\n  (opens, submits, closes to the replica; pins and forgets to "
            "the router) and the requests each carried;\n  the replicas' engine forwards per "
            "lifecycle and the rows each ran"
        )
