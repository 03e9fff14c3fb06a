"""Where a replica actor's time goes against the same engine in-process, and the floor that its
output stream sets.

The replica hands each gateway its tokens as items of one long-lived Ray streaming call
(``ReplicaActor.stream_outputs``): at most one item per engine step, fewer when the reader is
behind (what waits is merged). So per token the replica's process spends at least what the engine
spends in-process plus its share of one item's production (``bench.harness.stream_item_floor``,
measured here on bare actors at the item rate and shape of the run). ``ActorFloor`` reads both
processes' CPU over each run (``CpuMeter``: the replica actors' group, and this process for the
in-process engine), counts the items the reader took, and measures that item; with them, the
most that one item per step allows is ``in-process CPU ÷ (in-process CPU + items per token ×
the item's CPU in its producer)``, the ceiling of actor ÷ in-process on a box whose other core
runs the reader. And measured rather than computed: the same rounds on a bare engine actor
(``bench.harness.bare_engine_actor``: the engine streaming an item a step, nothing else).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Awaitable

import ray

from bench.harness.bare_engine_actor import bare_token_rounds
from bench.harness.cpu import CpuMeter
from bench.harness.direct_driver import DirectDriver
from bench.harness.inprocess_driver import InProcessDriver
from bench.harness.report import Table
from bench.harness.stats import Spread, ratios
from bench.harness.stream_item_floor import (
    ItemCost,
    PlainStreamProducer,
    RowsItem,
    process_cpu_s,
    stream_item_cost,
)
from bench.harness.workload import TokenRounds


class ActorFloor:
    """Side-by-side token rounds on the direct actor and in-process, with their CPU per token."""

    def __init__(
        self,
        direct: DirectDriver,
        inproc: InProcessDriver,
        bare: ray.actor.ActorHandle,
        cpu: CpuMeter,
        sessions: tuple[int, ...],
    ) -> None:
        self.sessions = sessions
        self.direct = direct
        self.inproc = inproc
        self.bare = bare
        self.cpu = cpu
        self.figures: dict[str, list[float]] = defaultdict(list)
        self.async_items: dict[int, ItemCost] = {}  # from an async generator (the fallback)
        self.plain_items: dict[int, ItemCost] = {}  # the replica's kind: a plain generator

    async def rounds(self, sessions: int, new_tokens: int = 64, rounds: int = 3) -> None:
        """One run of each path: ``rounds`` turns of ``new_tokens`` on ``sessions`` at once."""
        f, items = self.figures, self.direct.items
        run, used = await self._metered(self.direct.token_rounds(sessions, new_tokens, rounds))
        f[f"actor {sessions}"].append(run.rate)
        f[f"actor CPU {sessions}"].append(used["replica"] / run.tokens * 1e6)
        f[f"items/token {sessions}"].append((self.direct.items - items) / run.tokens)
        run, used = await self._metered(self._inproc_rounds(sessions, new_tokens, rounds))
        f[f"in-process {sessions}"].append(run.rate)
        f[f"in-process CPU {sessions}"].append(used["gateway"] / run.tokens * 1e6)
        pid = await self.bare.pid.remote()
        before = process_cpu_s(pid)
        run = await bare_token_rounds(self.bare, sessions, new_tokens, rounds)
        f[f"bare actor {sessions}"].append(run.rate)
        f[f"bare actor CPU {sessions}"].append((process_cpu_s(pid) - before) / run.tokens * 1e6)

    async def _inproc_rounds(self, sessions: int, new_tokens: int, rounds: int) -> TokenRounds:
        return self.inproc.token_rounds(sessions, new_tokens, rounds)

    async def _metered(self, work: Awaitable[TokenRounds]) -> tuple[TokenRounds, dict[str, float]]:
        """``work``'s rounds and the CPU each process group spent meanwhile."""
        before = self.cpu.sample()
        run = await work
        return run, CpuMeter.delta(before, self.cpu.sample())

    async def measure_items(self, seconds: float) -> None:
        """The CPU of one item of the shape and at the rate the actor's runs streamed."""
        for sessions in self.sessions:
            await self._measure_item(sessions, seconds)

    async def _measure_item(self, sessions: int, seconds: float) -> None:
        per_token = statistics.median(self.figures[f"items/token {sessions}"])
        rate = statistics.median(self.figures[f"actor {sessions}"]) * per_token
        rows = max(1, round(1 / per_token)) if per_token else sessions
        self.async_items[sessions] = await stream_item_cost(rate, seconds, RowsItem(rows))
        self.plain_items[sessions] = await stream_item_cost(
            rate, seconds, RowsItem(rows), PlainStreamProducer
        )

    def ceiling(self, sessions: int) -> float:
        f, item = self.figures, self.plain_items[sessions]  # the replica's kind of item
        engine = statistics.median(f[f"in-process CPU {sessions}"])
        per_token = statistics.median(f[f"items/token {sessions}"])
        return engine / (engine + per_token * item.producer_ms * 1e3)

    def bare_ratio(self, sessions: int) -> Spread:
        """Bare engine actor ÷ in-process tokens/s: what an actor streaming the engine reaches."""
        f = self.figures
        return ratios(f[f"bare actor {sessions}"], f[f"in-process {sessions}"])

    def print(self) -> None:
        f = self.figures
        print("\n3. tokens/s, 64 new tokens a turn, a turn on every session at once")
        table = Table(
            "sessions",
            "direct actor",
            "in-process",
            "bare engine actor",
            "actor / in-process",
            "bare / in-process",
        )
        for n in self.sessions:
            table.add(
                n,
                Spread.of(f[f"actor {n}"]).format(",.0f"),
                Spread.of(f[f"in-process {n}"]).format(",.0f"),
                Spread.of(f[f"bare actor {n}"]).format(",.0f"),
                ratios(f[f"actor {n}"], f[f"in-process {n}"]).format(),
                self.bare_ratio(n).format(),
            )
        table.print()
        print("\n3b. where the actor's time goes: CPU per token, and one output item's floor")
        table = Table(
            "sessions",
            "replica CPU us/token",
            "in-process us/token",
            "bare actor us/token",
            "items/token",
            "item CPU us (replica + reader)",
            "async generator's",
            "ceiling",
        )
        for n, item in self.plain_items.items():
            table.add(
                n,
                Spread.of(f[f"actor CPU {n}"]).format(".1f"),
                Spread.of(f[f"in-process CPU {n}"]).format(".1f"),
                Spread.of(f[f"bare actor CPU {n}"]).format(".1f"),
                Spread.of(f[f"items/token {n}"]).format(".3f"),
                f"{item.producer_ms * 1e3:.0f} + {item.consumer_ms * 1e3:.0f}",
                f"{self.async_items[n].producer_ms * 1e3:.0f} + "
                f"{self.async_items[n].consumer_ms * 1e3:.0f}",
                f"{self.ceiling(n):.2f}",
            )
        table.print()
        print(
            "ceiling: in-process CPU / (in-process CPU + items per token x the item's CPU in the "
            "replica), the most one item per step of the replica's kind (a plain generator on a "
            "stream thread of its own) allows; the rest of replica CPU - in-process CPU is the "
            "actor's own work (calls, event loop, GIL hand-offs). The async generator's item: the "
            "same item from an async generator on the event loop, the replica's kind when it has "
            "no stream thread free"
        )
