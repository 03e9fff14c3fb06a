"""Exact accounting of every pool: ``PoolStats``, ``PoolSnapshot`` and the leak invariant.

For each pool, every unit of capacity is in exactly one state: free, in use by a request in the
running batch, held by an idle session between turns, or cached (0 until a prefix cache exists).
The host tier's pools (``host_mamba``, ``host_kv_tokens``) are held by parked sessions only.
``leaked = capacity - (free + in_use + session_held + cached)`` must be 0 at every snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from replica.api import PoolSnapshot, PoolStats

if TYPE_CHECKING:
    from replica.pools.hybrid_pool import HybridReqToTokenPool
    from replica.sessions.request import Req
    from replica.sessions.session import StreamingSession

log = logging.getLogger(__name__)


class LeakError(RuntimeError):
    """Raised in strict mode when a snapshot does not account for every slot."""


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
    owning = [req for req in running if req.seq is not None]
    active = {req.seq.req_pool_idx for req in owning}
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
        *count_host_pools(sessions),
    )


def count_host_pools(sessions: StreamingSession) -> tuple[PoolStats, ...]:
    """The host tier (none without parking): parked sessions are its only owners, so nothing is
    ever ``in_use`` there; ``session_held`` counts from the parked sessions' records."""
    residency = sessions.residency
    if residency.parker is None:
        return ()
    host = residency.parker.host
    return (
        PoolStats("host_mamba", host.mamba.slots, host.mamba.num_free, 0, len(residency.parked)),
        PoolStats(
            "host_kv_tokens",
            host.kv.token_slots,
            host.kv.free_tokens,
            0,
            residency.host_held_tokens(),
        ),
    )
