"""An oracle of what a replica's pools must show, sharing no code with the replica.

The state machines keep their own record of which sessions are open, idle or running and how many
KV positions each holds; from it and the configured sizes alone, ``Capacity.expect`` says what
every pool's allocator must report free and what the snapshot must count in use and session-held.
``check_pools`` compares that with the allocators' own free counts (the ground truth a leak
changes) and with the replica's snapshot. Nothing here calls the pool or session code's own
capacity checks or held-slot counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from replica.api import PoolSnapshot, PoolStats
from replica.pools.host_pool import HostPools
from replica.pools.hybrid_pool import HybridReqToTokenPool


@dataclass(frozen=True)
class Capacity:
    """A replica's sizes, as a user configures them."""

    max_sessions: int
    track: int  # mamba track buffers per session
    kv_tokens: int
    page_size: int

    @property
    def mamba_per_session(self) -> int:
        return 1 + self.track

    @property
    def kv_pages(self) -> int:
        return self.kv_tokens // self.page_size

    def pages(self, positions: int) -> int:
        """Whole KV pages that ``positions`` token positions occupy."""
        return (positions + self.page_size - 1) // self.page_size

    def expect(
        self,
        idle: int,
        running: int,
        idle_pages: int,
        running_pages: int,
        cached: int = 0,
        cached_pages: int = 0,
    ) -> dict[str, PoolStats]:
        """Every pool's counts with ``idle`` sessions between turns holding ``idle_pages`` KV
        pages, ``running`` turns holding ``running_pages`` and ``cached`` states holding one
        mamba slot each and ``cached_pages`` KV pages that no session holds."""
        per, page = self.mamba_per_session, self.page_size
        used_pages = idle_pages + running_pages + cached_pages
        return {
            "mamba": PoolStats(
                "mamba",
                self.max_sessions * per,
                (self.max_sessions - idle - running) * per - cached,
                running * per,
                idle * per,
                cached,
            ),
            "kv_tokens": PoolStats(
                "kv_tokens",
                self.kv_pages * page,
                (self.kv_pages - used_pages) * page,
                running_pages * page,
                idle_pages * page,
                cached_pages * page,
            ),
            "req": PoolStats(
                "req", self.max_sessions, self.max_sessions - idle - running, running, idle
            ),
        }


def check_pools(
    pool: HybridReqToTokenPool,
    snapshot: PoolSnapshot,
    want: dict[str, PoolStats],
    host: HostPools | None = None,
) -> None:
    """The allocators' free counts (GPU, and the ``host`` tier's when given) and the snapshot's
    counts are exactly ``want``."""
    free = {
        "mamba": pool.mamba_pool.num_free,
        "kv_tokens": pool.kv_pool.free_tokens,
        "req": pool.num_free,
    }
    if host is not None:
        free |= {"host_mamba": host.mamba.num_free, "host_kv_tokens": host.kv.free_tokens}
    for name, stats in want.items():
        assert free[name] == stats.free, (
            f"{name} allocator has {free[name]} free, the model says {stats.free}: "
            f"want {stats.describe()}; snapshot {snapshot.pool(name).describe()}"
        )
        got = snapshot.pool(name)
        assert got == stats, f"snapshot {got.describe()}; the model says {stats.describe()}"
