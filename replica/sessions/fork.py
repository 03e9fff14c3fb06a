"""``Forker``: slots for a forked session, holding its parent's committed state.

The child's state equals the parent's committed state (``committed_len`` KV positions, the live
mamba state after them; the pending tokens the caller copies into the child's record):
- Resident parent, room on the GPU: the child gets a req row and 1 + track-buffer mamba slots of
  its own. The KV pages wholly below ``committed_len`` are shared by reference count (nothing
  copied); the last, partly filled page is copied into a fresh page of the child's, in the same
  batched copy as the mamba state (conv and SSM, every layer). A fork therefore copies one mamba
  state and at most one KV page, whatever the history's length.
- The parent has a turn running: its live mamba state is being advanced, so the committed state
  is the turn snapshot in track-buffer entry 0 (written when the turn started); without a track
  buffer there is no such copy and the fork is refused (``TurnRunningError``) until the turn
  ends. The KV positions below ``committed_len`` are not written by the turn.
- Parked parent: the child's state is copied from the parent's host slots (the parent stays
  parked): into fresh GPU slots when there is room (parking idle sessions for it if need be),
  else into host slots of its own (the child is born parked). Nothing is shared across tiers.
- Resident parent, no GPU room even after parking idle sessions: the child is born parked, its
  state copied from the GPU into host slots of its own.
Room is checked (and made) before anything changes; with none anywhere, ``PoolExhaustedError``.
A copy that fails gives back every slot the fork took before the error propagates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from replica.api import PoolExhaustedError, TurnRunningError
from replica.pools.host_pool import HostSlots
from replica.pools.hybrid_pool import HybridReqToTokenPool, SeqSlots
from replica.pools.state_copy import Places, StateCopier, StateTensors
from replica.sessions.residency import Residency

if TYPE_CHECKING:
    from replica.sessions.record import SessionRecord


class Forker:
    def __init__(
        self, pool: HybridReqToTokenPool, residency: Residency, copier: StateCopier
    ) -> None:
        self.pool = pool
        self.kv = pool.kv_pool
        self.residency = residency
        self.copier = copier
        self.gpu = StateTensors.of(pool.mamba_pool, pool.kv_pool)
        parker = residency.parker
        self.host = None if parker is None else StateTensors.of(parker.host.mamba, parker.host.kv)
        self.forks_total = 0
        self.bytes_copied = 0  # every state kind, every fork
        self.kv_bytes_copied = 0  # KV only (at most one page per fork from a resident parent)

    def place(self, parent: SessionRecord) -> tuple[SeqSlots | None, HostSlots | None]:
        """Slots holding a copy of ``parent``'s committed state (see the module's contract)."""
        if parent.parked:
            placed = self._from_host(parent)
        else:
            placed = self._from_gpu(parent, self._live_state(parent))
        self.forks_total += 1
        return placed

    def _live_state(self, parent: SessionRecord) -> int:
        """The mamba slot holding ``parent``'s committed recurrent state now."""
        if parent.turn is None:
            return parent.seq.mamba_pool_idx
        if not parent.seq.mamba_track_buffer:
            raise TurnRunningError(
                f"session {parent.session_id} has a turn running and this replica keeps no "
                "turn snapshot of its committed state (--mamba-track-buffers 0); fork it after "
                "the turn ends"
            )
        return parent.seq.mamba_track_buffer[0]

    # ----- from a resident parent ---------------------------------------------------------------

    def _from_gpu(
        self, parent: SessionRecord, state: int
    ) -> tuple[SeqSlots | None, HostSlots | None]:
        n, page = parent.committed_len, self.kv.page_size
        need = page if n % page else 0
        fits = self.residency.gpu_fits(1, need)
        if fits or self.residency.make_gpu_room(1, need, keep={parent.session_id}):
            return self._share_on_gpu(parent, state), None
        host = self._host_slots(n)
        try:
            self._copy_to_host(self._gpu_places(parent.seq.req_pool_idx, state, n), host)
        except BaseException:
            self.residency.parker.host.free([host])
            raise
        return None, host

    def _share_on_gpu(self, parent: SessionRecord, state: int) -> SeqSlots:
        table, n = self.pool.req_to_token, parent.committed_len
        seq = self.pool.alloc_seqs(1, zeroed=False)[0]
        held = 0  # KV positions the child's row holds so far (what to give back on failure)
        try:
            partial = self.kv.share_prefix(table, parent.seq.req_pool_idx, seq.req_pool_idx, n)
            held = n
            pages = [] if partial is None else [partial]
            at = Places(_ints([state]), _ints([src for src, _ in pages]))
            to = Places(_ints([seq.mamba_pool_idx]), _ints([dst for _, dst in pages]))
            self._count(self._copy_within(self.gpu, at, to), len(pages))
        except BaseException:
            self.pool.free_seq(seq, held)
            raise
        return seq

    # ----- from a parked parent -----------------------------------------------------------------

    def _from_host(self, parent: SessionRecord) -> tuple[SeqSlots | None, HostSlots | None]:
        n, src = parent.committed_len, parent.host
        at = Places(_ints([src.mamba_idx]), src.kv_pages)
        tokens = self.kv.held_tokens(n)
        fits = self.residency.gpu_fits(1, tokens)
        if fits or self.residency.make_gpu_room(1, tokens, keep=()):
            seq, held = self.pool.alloc_seqs(1, zeroed=False)[0], 0
            try:
                self.kv.extend(self.pool.req_to_token, seq.req_pool_idx, 0, n)
                held = n
                to = self._gpu_places(seq.req_pool_idx, seq.mamba_pool_idx, n)
                self._count(self.copier.copy_state(self.host, at, self.gpu, to), len(to.pages))
            except BaseException:
                self.pool.free_seq(seq, held)
                raise
            return seq, None
        host = self._host_slots(n)
        try:
            self._count(self._copy_within(self.host, at, _places(host)), host.kv_pages.numel())
        except BaseException:
            self.residency.parker.host.free([host])
            raise
        return None, host

    # ----- helpers ------------------------------------------------------------------------------

    def _host_slots(self, committed_len: int) -> HostSlots:
        parker = self.residency.parker
        pages = 0 if parker is None else parker.host.pages_for(committed_len)
        if parker is None or not parker.host.can_hold(1, pages):
            raise PoolExhaustedError(
                f"no room to fork a session of {committed_len} tokens: {self.pool.num_free} "
                f"req rows, {self.pool.mamba_pool.num_free} mamba slots and "
                f"{self.kv.free_tokens} KV token slots free"
                + ("" if parker is None else ", and the host tier is full")
                + "; close sessions or retry when turns end"
            )
        return parker.host.alloc([pages])[0]

    def _copy_to_host(self, at: Places, host: HostSlots) -> None:
        """The GPU's state at ``at`` into the host slots ``host`` (the copier's staged copy)."""
        copied = self.copier.copy_state(self.gpu, at, self.host, _places(host))
        self._count(copied, host.kv_pages.numel())

    def _copy_within(self, tensors: StateTensors, at: Places, to: Places) -> int:
        """``to = at`` inside one tier's pools (``tensors``: the GPU's or the host's): one gather
        and one scatter per state kind (the copier's gathers write into their target, and its
        scatters read a view of their target, neither of which may overlap in one tensor)."""
        copied = 0
        kinds = zip(tensors, _per_kind(at), _per_kind(to))
        for tensor, src, dst in kinds:
            if src.numel():
                part = tensor.index_select(1, src.to(tensor.device))
                tensor.index_copy_(1, dst.to(tensor.device), part)
                copied += part.numel() * part.element_size()
        return copied

    def _gpu_places(self, row: int, state: int, n: int) -> Places:
        page = self.kv.page_size
        firsts = self.pool.req_to_token[row, :n:page].to("cpu", torch.int64) // page
        return Places(_ints([state]), firsts)

    def _count(self, copied: int, pages: int) -> None:
        self.bytes_copied += copied
        k = self.gpu.k
        page_bytes = k.shape[0] * k[0, 0].numel() * k.element_size() * 2  # K and V, every layer
        self.kv_bytes_copied += pages * page_bytes


def _per_kind(places: Places) -> tuple[torch.Tensor, ...]:
    """The slots of each state kind (conv, SSM, K, V) at ``places``."""
    return places.mamba, places.mamba, places.pages, places.pages


def _places(host: HostSlots) -> Places:
    """Where a session's state lies in the host tier's pools."""
    return Places(_ints([host.mamba_idx]), host.kv_pages)


def _ints(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)
