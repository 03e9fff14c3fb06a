"""Exact accounting of every pool: ``PoolStats``, ``PoolSnapshot`` and the leak invariant.

For each pool, every unit of capacity is in exactly one state: free, in use by a request in the
running batch, held by an idle session between turns, or cached (0 until a prefix cache exists).
``leaked = capacity - (free + in_use + session_held + cached)`` must be 0 at every snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replica.engine.request import Req
    from replica.pools.hybrid_pool import HybridReqToTokenPool
    from replica.sessions.session import StreamingSession

log = logging.getLogger(__name__)

POOL_NAMES = ("mamba", "kv_tokens", "req")


class LeakError(RuntimeError):
    """Raised in strict mode when a snapshot does not account for every slot."""


@dataclass(frozen=True, slots=True)
class PoolStats:
    pool: str
    capacity: int
    free: int
    in_use: int
    session_held: int
    cached: int = 0

    @property
    def leaked(self) -> int:
        return self.capacity - (self.free + self.in_use + self.session_held + self.cached)

    def describe(self) -> str:
        return (
            f"{self.pool}: capacity={self.capacity} free={self.free} in_use={self.in_use} "
            f"session_held={self.session_held} cached={self.cached} leaked={self.leaked}"
        )


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A consistent view of one replica's pools, taken between engine steps. Cheap to pickle."""

    replica_id: str
    incarnation: str
    pools: tuple[PoolStats, ...]
    open_sessions: int
    running_requests: int
    waiting_requests: int
    taken_at: float  # time.time() on the replica
    draining: bool = False
    sessions_opened_total: int = 0
    sessions_released_total: dict[str, int] = field(default_factory=dict)

    def pool(self, name: str) -> PoolStats:
        for stats in self.pools:
            if stats.pool == name:
                return stats
        raise KeyError(f"no pool named {name!r} in snapshot of {self.replica_id}")

    @property
    def leaked(self) -> int:
        return sum(abs(stats.leaked) for stats in self.pools)

    @property
    def consistent(self) -> bool:
        return all(stats.leaked == 0 for stats in self.pools)


class InvariantChecker:
    """Checks snapshots; counts violations; logs them loudly; raises in strict mode."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.violations = 0

    def check(self, snapshot: PoolSnapshot) -> None:
        if snapshot.consistent:
            return
        self.violations += 1
        detail = "; ".join(stats.describe() for stats in snapshot.pools)
        message = f"pool accounting broken on replica {snapshot.replica_id}: {detail}"
        log.error(message)
        if self.strict:
            raise LeakError(message)


def count_pools(
    pool: HybridReqToTokenPool, sessions: StreamingSession, running: Iterable[Req]
) -> tuple[PoolStats, ...]:
    """Count every pool by state. Each count comes from its own source: ``free`` from the
    allocators, ``in_use`` from the running requests, ``session_held`` from the idle sessions, so
    a slot that nobody owns shows up as ``leaked`` instead of hiding in another count."""
    owning = [req for req in running if req.owns_slots]
    active = {req.req_pool_idx for req in owning}
    kv = pool.kv_pool
    return (
        PoolStats(
            "mamba",
            pool.mamba_pool.slots,
            pool.mamba_pool.num_free,
            len(owning) * pool.slots_per_seq,
            sessions.session_held_mamba_slots(active),
        ),
        PoolStats(
            "kv_tokens",
            kv.token_slots,
            kv.free_tokens,
            sum(kv.held_tokens(req.kv_len) for req in owning),
            sessions.session_held_tokens(active),
        ),
        PoolStats(
            "req", pool.rows, pool.num_free, len(owning), sessions.session_held_req_slots(active)
        ),
    )
