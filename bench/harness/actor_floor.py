"""Where a replica actor's time goes against the same engine in-process: the same token rounds
side by side on

- the direct actor: the replica, its outputs read from its output socket, as a gateway does;
- the same replica read over its Ray stream (the gateway's fallback, and the replica's only
  stream before the socket);
- a replica outside the cluster (no router to report to, no gateway or controller calling it)
  with its own checkpoint store: what of the replica's work is the cluster's;
- the same without session checkpoints (a turn's end waits for its checkpoint otherwise): what
  of the replica's own work is its checkpoints;
- the engine in-process (the yardstick);
- a bare engine actor (``bench.harness.bare_engine_actor``: the engine streaming an item a step
  over Ray, nothing else): what any actor streaming its steps over Ray reaches.

Each with the CPU per token of the replica's processes (``CpuMeter``'s replica group) and of the
reader (this process), and the output items per token.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable

import ray

from bench.harness.bare_engine_actor import bare_token_rounds
from bench.harness.cpu import CpuMeter
from bench.harness.direct_driver import DirectDriver
from bench.harness.inprocess_driver import InProcessDriver
from bench.harness.report import Table
from bench.harness.stats import Spread, ratios
from bench.harness.stream_item_floor import process_cpu_s
from bench.harness.workload import TokenRounds

# the DirectDriver paths, in run order
ACTOR_PATHS = ("actor", "over Ray", "standalone", "no checkpoints")


class ActorFloor:
    """Side-by-side token rounds on the replica's paths, in-process and on a bare actor."""

    def __init__(
        self,
        drivers: dict[str, DirectDriver],
        inproc: InProcessDriver,
        bare: ray.actor.ActorHandle,
        cpu: CpuMeter,
        sessions: tuple[int, ...],
    ) -> None:
        """``drivers``: one per name of ``ACTOR_PATHS``."""
        self.sessions = sessions
        self.drivers = drivers
        self.inproc = inproc
        self.bare = bare
        self.cpu = cpu
        self.figures: dict[str, list[float]] = defaultdict(list)
        self._runs = 0

    async def rounds(self, sessions: int, new_tokens: int = 64, rounds: int = 3) -> None:
        """One run of each path: ``rounds`` turns of ``new_tokens`` on ``sessions`` at once. The
        replica's paths take turns at going first (the first after other work runs slower)."""
        f = self.figures
        first = self._runs % len(ACTOR_PATHS)
        self._runs += 1
        for path in ACTOR_PATHS[first:] + ACTOR_PATHS[:first]:
            driver = self.drivers[path]
            items = driver.items
            run, used = await self._metered(driver.token_rounds(sessions, new_tokens, rounds))
            f[f"{path} {sessions}"].append(run.rate)
            f[f"{path} CPU {sessions}"].append(used["replica"] / run.tokens * 1e6)
            f[f"{path} reader CPU {sessions}"].append(used["gateway"] / run.tokens * 1e6)
            f[f"{path} items/token {sessions}"].append((driver.items - items) / run.tokens)
        run, used = await self._metered(self._inproc_rounds(sessions, new_tokens, rounds))
        f[f"in-process {sessions}"].append(run.rate)
        f[f"in-process CPU {sessions}"].append(used["gateway"] / run.tokens * 1e6)
        pid = await self.bare.pid.remote()
        before, reader = process_cpu_s(pid), self.cpu.sample()
        run = await bare_token_rounds(self.bare, sessions, new_tokens, rounds)
        f[f"bare actor {sessions}"].append(run.rate)
        f[f"bare actor CPU {sessions}"].append((process_cpu_s(pid) - before) / run.tokens * 1e6)
        reader = CpuMeter.delta(reader, self.cpu.sample())["gateway"]
        f[f"bare actor reader CPU {sessions}"].append(reader / run.tokens * 1e6)

    async def _inproc_rounds(self, sessions: int, new_tokens: int, rounds: int) -> TokenRounds:
        return self.inproc.token_rounds(sessions, new_tokens, rounds)

    async def _metered(self, work: Awaitable[TokenRounds]) -> tuple[TokenRounds, dict[str, float]]:
        """``work``'s rounds and the CPU each process group spent meanwhile."""
        before = self.cpu.sample()
        run = await work
        return run, CpuMeter.delta(before, self.cpu.sample())

    def ratio(self, path: str, sessions: int) -> Spread:
        """``path``'s tokens/s ÷ in-process, repetition by repetition."""
        f = self.figures
        return ratios(f[f"{path} {sessions}"], f[f"in-process {sessions}"])

    def print(self) -> None:
        f = self.figures
        paths = (*ACTOR_PATHS, "bare actor")
        print("\n3. tokens/s, 64 new tokens a turn, a turn on every session at once")
        table = Table("sessions", *paths, "in-process", *(f"{p} / in-process" for p in paths))
        for n in self.sessions:
            table.add(
                n,
                *(Spread.of(f[f"{p} {n}"]).format(",.0f") for p in paths),
                Spread.of(f[f"in-process {n}"]).format(",.0f"),
                *(self.ratio(p, n).format() for p in paths),
            )
        table.print()
        print(
            "actor: the replica, its outputs read from its output socket (as a gateway reads "
            "them); over Ray: the same replica, read from its Ray stream; standalone: a replica "
            "outside the cluster with its own checkpoint store; no checkpoints: the same without "
            "session checkpoints; both read from their sockets; bare actor: the engine "
            "streaming an item a step over Ray, nothing else"
        )
        print("\n3b. CPU us per token: the replica's processes / the reader (this process)")
        table = Table("sessions", *paths, "in-process", "actor items/token")
        for n in self.sessions:
            table.add(
                n,
                *(
                    f"{Spread.of(f[f'{p} CPU {n}']).median:.0f} / "
                    f"{Spread.of(f[f'{p} reader CPU {n}']).median:.0f}"
                    for p in paths
                ),
                Spread.of(f[f"in-process CPU {n}"]).format(".0f"),
                Spread.of(f[f"actor items/token {n}"]).format(".3f"),
            )
        table.print()
