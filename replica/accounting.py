"""Exact accounting of every pool: ``PoolStats``, ``PoolSnapshot`` and the leak invariant.

For each pool, every unit of capacity is in exactly one state: free, in use by a request in the
running batch, held by an idle session between turns, or cached (a state kept at a turn boundary,
``StateCache``: one mamba slot each and its KV pages).
The host tier's pools (``host_mamba``, ``host_kv_tokens``) are held by parked sessions only.
``leaked = capacity - (free + in_use + session_held + cached)`` must be 0 at every snapshot.

KV pages may be shared (forked sessions hold their parent's pages by reference count). A shared
page is counted once: ``in_use`` when any running request holds it (even if idle sessions hold it
too), else ``session_held`` when an idle session holds it, else ``cached``.
``check_page_refs`` checks that every page's reference count is exactly the number of rows and
cached states that hold it, so a reference nobody holds is reported as a leak too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from replica.api import PoolSnapshot, PoolStats, SlotStateError

if TYPE_CHECKING:
    from replica.pools.hybrid_pool import HybridReqToTokenPool
    from replica.sessions.request import Req
    from replica.sessions.table import SessionTable

log = logging.getLogger(__name__)


class LeakError(RuntimeError):
    """Raised in strict mode when a snapshot does not account for every slot."""


class InvariantChecker:
    """Checks snapshots; counts violations; logs them loudly; raises in strict mode."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.violations = 0

    def check(self, snapshot: PoolSnapshot, page_refs: str | None = None) -> None:
        """``page_refs``: ``check_page_refs``'s line for leaked page references, if any."""
        if snapshot.consistent and page_refs is None:
            return
        self.violations += 1
        details = [stats.describe() for stats in snapshot.pools]
        detail = "; ".join(details if page_refs is None else [*details, page_refs])
        message = f"pool accounting broken on replica {snapshot.replica_id}: {detail}"
        log.error(message)
        if self.strict:
            raise LeakError(message)


def count_pools(
    pool: HybridReqToTokenPool, sessions: SessionTable, running: Iterable[Req]
) -> tuple[PoolStats, ...]:
    """Count every pool by state. Each count comes from its own source: ``free`` from the
    allocators, ``in_use`` from the running requests, ``session_held`` from the idle sessions, so
    a slot that nobody owns shows up as ``leaked`` instead of hiding in another count."""
    owning = [req for req in running if req.seq is not None]
    active = {req.seq.req_pool_idx for req in owning}
    kv = pool.kv_pool
    kv_in_use, kv_held, kv_cached = count_kv(pool, sessions, owning, active)
    return (
        PoolStats(
            "mamba",
            pool.mamba_pool.slots,
            pool.mamba_pool.num_free,
            len(owning) * pool.slots_per_seq,
            sessions.session_held_mamba_slots(active),
            len(sessions.cache),
        ),
        PoolStats(
            "kv_tokens",
            kv.token_slots,
            kv.free_tokens,
            kv_in_use,
            kv_held,
            kv_cached,
        ),
        PoolStats(
            "req", pool.rows, pool.num_free, len(owning), sessions.session_held_req_slots(active)
        ),
        *count_host_pools(sessions),
    )


def count_kv(
    pool: HybridReqToTokenPool, sessions: SessionTable, owning: list[Req], active: set[int]
) -> tuple[int, int, int]:
    """KV token slots ``(in_use, session_held, cached)``, each shared page once (in use before
    held before cached)."""
    kv = pool.kv_pool
    if not kv.page_allocator.shared_refs:  # nothing shared: plain sums, no per-page work
        in_use = sum(kv.held_tokens(req.kv_len) for req in owning)
        return in_use, sessions.session_held_tokens(active), sessions.cache.held_tokens()
    table = pool.req_to_token
    running = kv.distinct_pages(table, [(req.seq.req_pool_idx, req.kv_len) for req in owning])
    idle = kv.distinct_pages(table, sessions.session_held_rows(active))
    held = idle[~torch.isin(idle, running)]
    lists = sessions.cache.page_lists()
    cached = torch.unique(torch.cat(lists)) if lists else torch.empty(0, dtype=torch.int64)
    cached_only = int((~torch.isin(cached, torch.cat([running, held]))).sum())
    return running.numel() * kv.page_size, held.numel() * kv.page_size, cached_only * kv.page_size


def check_page_refs(
    pool: HybridReqToTokenPool, sessions: SessionTable, running: Iterable[Req]
) -> str | None:
    """Compare every KV page's reference count with the number of rows (running requests and idle
    resident sessions) and cached states that hold it. A count below its holders means a page
    that may be handed out while still read: raises ``SlotStateError``. A count above them is a
    leaked reference (the page can never return to ``free``, and while a cache entry still
    holds it the snapshot cannot see it): returned as a line for the leak checker; ``None``
    when every count is exact."""
    kv, table = pool.kv_pool, pool.req_to_token
    owning = [req for req in running if req.seq is not None]
    active = {req.seq.req_pool_idx for req in owning}
    rows = [(req.seq.req_pool_idx, req.kv_len) for req in owning]
    rows += sessions.session_held_rows(active)
    pages = [kv.pages_of(table, row, 0, n) for row, n in rows]
    pages += sessions.cache.page_lists()
    holders = torch.zeros(kv.page_allocator.size, dtype=torch.int64)
    if pages:
        holders.index_add_(
            0, torch.cat(pages), torch.ones(sum(p.numel() for p in pages), dtype=torch.int64)
        )
    refs = kv.page_allocator.refcounts(torch.arange(kv.page_allocator.size))
    short = (refs < holders).nonzero().flatten()[:8].tolist()
    if short:
        raise SlotStateError(
            f"KV page reference counts below their holders: pages {short} have "
            f"counts {refs[short].tolist()} but {holders[short].tolist()} holders"
        )
    excess = (refs > holders).nonzero().flatten()
    if not excess.numel():
        return None
    shown = excess[:8].tolist()
    return (
        f"kv_pages: {excess.numel()} pages hold references nobody owns (pages {shown}: "
        f"counts {refs[shown].tolist()}, holders {holders[shown].tolist()})"
    )


def count_host_pools(sessions: SessionTable) -> tuple[PoolStats, ...]:
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
