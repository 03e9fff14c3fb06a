"""``Parker``: moves idle sessions' state between the GPU pools and the host tier.

This is the mechanism; which sessions park, and when, is ``SessionTable``'s policy.
- ``park(slots)``: the live mamba state (conv and SSM, every layer) and the KV pages of the
  committed tokens of every session in ``slots`` go to fresh host slots in one batched copy per
  state kind, then every GPU slot they held is freed (req row, 1 + track-buffer mamba slots, KV
  pages). Their records now hold ``HostSlots`` instead of ``SeqSlots``.
- ``restore(slots)``: the reverse, into fresh GPU slots (the track buffer is taken fresh: it is
  written at the start of every turn), then the host slots are freed.
- ``swap(victims, restorees)``: both at once when the host has room for the victims only once the
  restorees have left it; the victims' state waits in a transient host copy meanwhile.
Every method checks room before it changes anything (``PoolExhaustedError``), allocates before
it frees and copies before it switches a session's record, and any step that fails (an
allocation, a copy) rolls back what the method had done: each session's state is afterwards in
exactly one place, the one it was in before. Restored state is bit-identical: the bytes are
copied, never converted.

Failpoints (``replica.failpoints``), each firing once: ``park_copy_fails`` (the next GPU<->host
state copy raises) and ``park_host_alloc_fails`` (the next host-slot allocation raises).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from replica.api import PoolExhaustedError
from replica.config import PoolConfig
from replica.failpoints import occurrence as failpoints_occurrence
from replica.histogram import LatencyHistogram
from replica.model.config import ModelConfig
from replica.pools.host_pool import HostPools, HostSlots
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.pools.kv_pool import pages_for
from replica.pools.state_copy import Places, StateCopier, StateTensors

if TYPE_CHECKING:
    from replica.sessions.record import SessionRecord

RESTORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ParkingFault(RuntimeError):
    """A fault a failpoint injected into parking."""


class Parker:
    def __init__(
        self,
        pool: HybridReqToTokenPool,
        host: HostPools,
        copier: StateCopier,
        failpoints: frozenset[str] = frozenset(),
    ) -> None:
        self.pool = pool
        self.host = host
        self.copier = copier
        self.gpu_state = StateTensors.of(pool.mamba_pool, pool.kv_pool)
        self.host_state = StateTensors.of(host.mamba, host.kv)
        self.page_size = pool.kv_pool.page_size
        self.parks_total = 0
        self.restores_total = 0
        self.restore_seconds = LatencyHistogram(RESTORE_BUCKETS)
        self.bytes_moved = 0
        # fault name -> how many more of its operations run before it fires
        self._faults = {
            name: n - 1
            for name in ("park_copy_fails", "park_host_alloc_fails")
            if (n := failpoints_occurrence(failpoints, name)) is not None
        }

    @classmethod
    def build(
        cls,
        pool: HybridReqToTokenPool,
        model: ModelConfig,
        pools: PoolConfig,
        failpoints: frozenset[str] = frozenset(),
    ) -> Parker | None:
        """The parker of a replica's pools: its host tier and copier; None without parking."""
        if not pools.parking:
            return None
        cuda = torch.device(pools.device).type == "cuda"
        return cls(pool, HostPools(model, pools), StateCopier(cuda), failpoints)

    def _fault(self, name: str) -> None:
        left = self._faults.get(name)
        if left is None:
            return
        if left > 0:
            self._faults[name] = left - 1
            return
        del self._faults[name]
        raise ParkingFault(f"failpoint {name}")

    # ----- room -------------------------------------------------------------------------------

    def host_can_hold(self, slots: Sequence[SessionRecord]) -> bool:
        return self.host.can_hold(len(slots), sum(self._pages(s) for s in slots))

    def gpu_tokens(self, slot: SessionRecord) -> int:
        """KV token slots a parked session takes back on the GPU (whole pages)."""
        return self.pool.kv_pool.held_tokens(slot.committed_len)

    def _freed(self, slot: SessionRecord) -> int:
        """GPU KV token slots parking ``slot`` frees (pages it shares with nobody)."""
        return self.pool.kv_pool.freed_by_release(
            self.pool.req_to_token, slot.req_pool_idx, slot.committed_len
        )

    def _pages(self, slot: SessionRecord) -> int:
        return pages_for(slot.committed_len, self.page_size)

    # ----- moves ------------------------------------------------------------------------------

    def open_on_host(self) -> HostSlots:
        """Host slots for a new session (zero state, no KV): it is born parked."""
        return self._host_alloc([0], zeroed=True)[0]

    def park(self, slots: Sequence[SessionRecord]) -> None:
        """GPU -> host for idle resident sessions; then their GPU slots are freed."""
        if not slots:
            return
        host = self._host_alloc([self._pages(s) for s in slots])
        try:
            self._copy(self.gpu_state, self._gpu_places(slots), self.host_state, _places(host))
        except BaseException:
            self.host.free(host)
            raise
        self._free_gpu(slots)
        for slot, place in zip(slots, host):
            slot.host = place
        self.parks_total += len(slots)

    def restore(self, slots: Sequence[SessionRecord], since: float | None = None) -> None:
        """Host -> fresh GPU slots for parked sessions; then their host slots are freed. The
        restore time observed runs from ``since`` (``time.perf_counter()``; when the caller
        began making room for them), or from now."""
        if not slots:
            return
        started = time.perf_counter() if since is None else since
        self._take_gpu(slots)
        try:
            host = [s.host for s in slots]
            self._copy(self.host_state, _places(host), self.gpu_state, self._gpu_places(slots))
        except BaseException:
            self._free_gpu(slots)
            raise
        for slot in slots:
            slot.host = None
        self.host.free(host)
        self.restores_total += len(slots)
        self.restore_seconds.observe(time.perf_counter() - started, len(slots))

    def swap(
        self,
        victims: Sequence[SessionRecord],
        restorees: Sequence[SessionRecord],
        since: float | None = None,
    ) -> None:
        """Park ``victims`` and restore ``restorees`` when the GPU has room for the restorees
        only once the victims have left it, and the host has room for the victims only once
        the restorees have left it. The victims' state waits in a transient host copy
        meanwhile; if any later step fails, the restorees are parked again and the victims go
        back to the GPU from that copy."""
        pages = [self._pages(s) for s in victims]
        if not self._swap_fits(victims, pages, restorees):
            raise PoolExhaustedError(
                f"no room to swap {len(victims)} sessions out for {len(restorees)} in"
            )
        held = self.host_state.transient(len(victims), sum(pages))
        dense = Places.dense(len(victims), sum(pages))
        self._copy(self.gpu_state, self._gpu_places(victims), held, dense)
        self._free_gpu(victims)
        try:
            self.restore(restorees, since)  # on failure it undid itself: restorees still parked
        except BaseException:
            self._back_to_gpu(victims, held, dense)
            raise
        try:
            host = self._host_alloc(pages)
            try:
                self._copy(held, dense, self.host_state, _places(host))
            except BaseException:
                self.host.free(host)
                raise
        except BaseException:
            self.park(restorees)
            self.parks_total -= len(restorees)  # an undo, not a park
            self._back_to_gpu(victims, held, dense)
            raise
        for slot, place in zip(victims, host):
            slot.host = place
        self.parks_total += len(victims)

    def _back_to_gpu(
        self, victims: Sequence[SessionRecord], held: StateTensors, at: Places
    ) -> None:
        """Victims of a swap that failed return to fresh GPU slots from their transient copy."""
        self._take_gpu(victims)
        self._copy(held, at, self.gpu_state, self._gpu_places(victims))

    def _swap_fits(
        self, victims: Sequence[SessionRecord], pages: list[int], restorees: Sequence[SessionRecord]
    ) -> bool:
        kv, per_seq = self.pool.kv_pool, self.pool.slots_per_seq
        out, back = len(victims), len(restorees)
        gpu_fits = (
            self.pool.num_free + out >= back
            and self.pool.mamba_pool.num_free + out * per_seq >= back * per_seq
            and kv.free_tokens + sum(self._freed(s) for s in victims)
            >= sum(self.gpu_tokens(s) for s in restorees)
        )
        freed_pages = sum(self._pages(s) for s in restorees)
        return gpu_fits and self.host.can_hold(max(0, out - back), max(0, sum(pages) - freed_pages))

    def free_host(self, slot: SessionRecord) -> None:
        self.host.free([slot.host])
        slot.host = None

    # ----- GPU side ---------------------------------------------------------------------------

    def _take_gpu(self, slots: Sequence[SessionRecord]) -> None:
        kv = self.pool.kv_pool
        tokens = sum(self.gpu_tokens(s) for s in slots)
        if not self.pool.can_alloc(len(slots)) or tokens > kv.free_tokens:
            raise PoolExhaustedError(
                f"no GPU room to restore {len(slots)} sessions: {self.pool.num_free} req rows, "
                f"{self.pool.mamba_pool.num_free} mamba slots and {kv.free_tokens} KV token "
                f"slots free, they need {tokens} KV token slots"
            )
        for slot, seq in zip(slots, self.pool.alloc_seqs(len(slots), zeroed=False)):
            kv.extend(self.pool.req_to_token, seq.req_pool_idx, 0, slot.committed_len)
            slot.seq = seq

    def _free_gpu(self, slots: Sequence[SessionRecord]) -> None:
        self.pool.free_seqs([s.seq for s in slots], [s.committed_len for s in slots])
        for slot in slots:
            slot.seq = None

    def _gpu_places(self, slots: Sequence[SessionRecord]) -> Places:
        table, p = self.pool.req_to_token, self.page_size
        firsts = [table[s.seq.req_pool_idx, : s.committed_len : p] for s in slots]
        pages = torch.cat(firsts).to("cpu", torch.int64) // p
        return Places(torch.tensor([s.seq.mamba_pool_idx for s in slots]), pages)

    def _copy(self, src: StateTensors, at: Places, dst: StateTensors, to: Places) -> None:
        self._fault("park_copy_fails")
        self.bytes_moved += self.copier.copy_state(src, at, dst, to)

    def _host_alloc(self, page_counts: list[int], zeroed: bool = False) -> list[HostSlots]:
        self._fault("park_host_alloc_fails")
        return self.host.alloc(page_counts, zeroed)


def _places(host: Sequence[HostSlots]) -> Places:
    pages = [h.kv_pages for h in host]
    return Places(
        torch.tensor([h.mamba_idx for h in host], dtype=torch.int64),
        torch.cat(pages) if pages else torch.empty(0, dtype=torch.int64),
    )
