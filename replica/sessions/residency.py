"""``Residency``: where each open session's state lives, and the parking policy.

A session is *resident* (its ``SessionRecord.seq`` holds GPU slots) or *parked* (its ``host`` holds
host slots); never both, never neither. Resident sessions with no turn running are kept in
``idle_lru``, least recently active first, so choosing whom to park costs O(sessions parked), never
O(sessions open): the engine step stays O(active turns).

Policy (the mechanism is ``Parker``):
- A new session goes to the GPU when it has room; else the least recently used idle resident
  session is parked to make room; else (every GPU slot runs a turn, or the host cannot take the
  idle ones) it starts parked, with zero state in host slots. Only when the host has no room
  either is the open refused.
- A turn of a parked session restores it first; a turn that needs GPU room (row, mamba slots, KV)
  parks least recently used idle sessions to make it, swapping through the host when the host has
  room for them only once the restored session has left it. The turn's own session is never
  parked for it. When no room can be made, the turn waits for running turns to end (or is
  refused when nothing runs).
- With ``park_after_idle_s``, sessions idle that long are parked in one batch (``park_idle``).
Without a ``Parker`` (parking off) every session is resident and no room is ever made by parking.
Cached states (``StateCache``) hold free room only: every path here evicts them first, as far as
it needs room, before it parks anyone or refuses.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from replica.api import ParkingStats, PoolExhaustedError
from replica.pools.host_pool import HostSlots
from replica.pools.hybrid_pool import HybridReqToTokenPool, SeqSlots
from replica.sessions.parking import Parker
from replica.sessions.state_cache import StateCache

if TYPE_CHECKING:
    from replica.sessions.record import SessionRecord


class Residency:
    def __init__(
        self,
        pool: HybridReqToTokenPool,
        parker: Parker | None,
        clock: Callable[[], float],
        cache: StateCache,
    ) -> None:
        self.pool = pool
        self.kv = pool.kv_pool
        self.parker = parker
        self.cache = cache
        self.clock = clock
        self.idle_lru: OrderedDict[str, SessionRecord] = OrderedDict()
        self.parked: dict[str, SessionRecord] = {}

    # ----- lifecycle hooks (called by SessionTable) ------------------------------------

    def gpu_fits(self, seqs: int, kv_tokens: int) -> bool:
        """Whether ``seqs`` sequences and ``kv_tokens`` KV token slots are free, after evicting
        cached states as far as that takes (never parking)."""
        return self.cache.make_room(seqs, kv_tokens)

    def can_place_new(self) -> bool:
        if self.gpu_fits(1, 0):
            return True
        return self.parker is not None and self.parker.host.can_hold(1, 0)

    def place_new(self) -> tuple[SeqSlots | None, HostSlots | None]:
        """Slots for a new session: GPU slots, or host slots (born parked). Raises
        ``PoolExhaustedError`` when neither the GPU nor the host has room."""
        if self.gpu_fits(1, 0) or self.make_gpu_room(1, 0, keep=()):
            return self.pool.alloc_seqs(1)[0], None
        if self.parker is not None and self.parker.host.can_hold(1, 0):
            return None, self.parker.open_on_host()
        if self.parker is None:
            raise PoolExhaustedError(
                f"replica is full: sessions hold all {self.pool.rows} GPU session slots "
                f"({self.pool.mamba_pool.num_free} mamba slots free); close sessions, or raise "
                "--max-sessions or --max-parked-sessions"
            )
        raise PoolExhaustedError(
            f"replica is full: sessions hold all {self.pool.rows} GPU session slots and "
            f"{len(self.parked)} parked sessions fill the host tier; close sessions or raise "
            "--max-parked-sessions"
        )

    def place_imported(self, committed_len: int) -> tuple[SeqSlots | None, HostSlots | None]:
        """Slots for a session imported with ``committed_len`` KV positions: GPU slots with
        those positions' KV pages when the GPU has room (parking idle sessions to make it if need
        be), else host slots (it arrives parked). Nothing is zeroed: the import writes it all.
        Raises ``PoolExhaustedError`` when neither has room."""
        tokens = self.kv.held_tokens(committed_len)
        if self.gpu_fits(1, tokens) or self.make_gpu_room(1, tokens, keep=()):
            seq = self.pool.alloc_seqs(1, zeroed=False)[0]
            self.kv.extend(self.pool.req_to_token, seq.req_pool_idx, 0, committed_len)
            return seq, None
        if self.parker is not None:
            pages = self.parker.host.pages_for(committed_len)
            if self.parker.host.can_hold(1, pages):
                return None, self.parker.host.alloc([pages])[0]
        raise PoolExhaustedError(
            f"no room for a session of {committed_len} tokens: {self.pool.num_free} req rows, "
            f"{self.pool.mamba_pool.num_free} mamba slots and {self.kv.free_tokens} KV token "
            "slots free" + ("" if self.parker is None else ", and the host tier is full")
        )

    def opened(self, slot: SessionRecord) -> None:
        if slot.parked:
            self.parked[slot.session_id] = slot
        else:
            self.idle_lru[slot.session_id] = slot

    def turn_started(self, slot: SessionRecord) -> None:
        self.idle_lru.pop(slot.session_id, None)

    def turn_ended(self, slot: SessionRecord) -> None:
        self.idle_lru[slot.session_id] = slot  # most recently active: the end of the order

    def touch(self, slot: SessionRecord) -> None:
        """A turn was submitted: the session counts as active now (and is parked last)."""
        slot.last_active = self.clock()
        if slot.session_id in self.idle_lru:
            self.idle_lru.move_to_end(slot.session_id)

    def released(self, slot: SessionRecord) -> None:
        """Forget a released session; a parked one's host slots are freed."""
        self.idle_lru.pop(slot.session_id, None)
        if self.parked.pop(slot.session_id, None) is not None:
            self.parker.free_host(slot)

    # ----- room for turns -------------------------------------------------------------------

    def room_for_turn(self, slot: SessionRecord, target: int) -> bool:
        """Make GPU room for a turn of ``slot`` that holds positions up to ``target``: restore
        it if it is parked, park others if needed. False when the room cannot be made now."""
        if not slot.parked:
            need = self.kv.tokens_needed(slot.committed_len, target)
            # a page more if its last page is shared (copied on write): evict for it too
            self.gpu_fits(0, need + self.kv.page_size)
            return self.gpu_fits(0, need) or self.make_gpu_room(0, need, {slot.session_id})
        since = time.perf_counter()
        self.gpu_fits(1, self.kv.held_tokens(target))
        victims = self._victims(1, self.kv.held_tokens(target), keep=())
        if victims is None:
            return False
        if self.parker.host_can_hold(victims):
            self.park(victims)
            self.unpark([slot], since)
        else:
            try:
                self.parker.swap(victims, [slot], since)
            except PoolExhaustedError:
                return False
            self._moved(parked=victims, restored=[slot])
        return True

    def make_gpu_room(self, seqs: int, kv_tokens: int, keep: Collection[str]) -> bool:
        """Park least recently used idle sessions (none in ``keep``) until ``seqs`` more
        sequences and ``kv_tokens`` more KV token slots fit; False (nothing parked) when that
        cannot be done. Cached states are evicted first: they never cause a park."""
        if self.gpu_fits(seqs, kv_tokens):
            return True
        victims = self._victims(seqs, kv_tokens, keep)
        if not victims or not self.parker.host_can_hold(victims):
            return False
        self.park(victims)
        return True

    def _victims(self, seqs: int, kv_tokens: int, keep: Collection[str]) -> list | None:
        """The least recently used idle resident sessions (not in ``keep``) whose GPU slots,
        with the free ones, make room for ``seqs`` sequences and ``kv_tokens`` KV token slots;
        [] when there is room already, None when parking every idle one would not do."""
        per_seq = self.pool.slots_per_seq
        rows, mamba, kv = self.pool.num_free, self.pool.mamba_pool.num_free, self.kv.free_tokens
        victims: list[SessionRecord] = []
        for slot in self.idle_lru.values():
            if rows >= seqs and mamba >= seqs * per_seq and kv >= kv_tokens:
                return victims
            if self.parker is None:
                return None
            if slot.session_id in keep:
                continue
            victims.append(slot)
            rows, mamba = rows + 1, mamba + per_seq
            # what parking it frees: its pages no other row shares (a page shared with another
            # victim is not counted, so the estimate never promises room that does not appear)
            kv += self.kv.freed_by_release(
                self.pool.req_to_token, slot.req_pool_idx, slot.committed_len
            )
        return victims if rows >= seqs and mamba >= seqs * per_seq and kv >= kv_tokens else None

    # ----- moves ----------------------------------------------------------------------------

    def park(self, slots: list[SessionRecord]) -> None:
        self.parker.park(slots)
        self._moved(parked=slots, restored=())

    def unpark(self, slots: list[SessionRecord], since: float | None = None) -> None:
        self.parker.restore(slots, since)
        self._moved(parked=(), restored=slots)

    def _moved(self, parked, restored) -> None:
        for slot in parked:
            del self.idle_lru[slot.session_id]
            self.parked[slot.session_id] = slot
        for slot in restored:
            del self.parked[slot.session_id]
            self.idle_lru[slot.session_id] = slot

    def park_idle(self, idle_s: float) -> int:
        """Park, in one batch, the resident sessions idle for ``idle_s`` or longer that the host
        can take (least recently active first); returns how many."""
        if self.parker is None:
            return 0
        now, batch, pages, host = self.clock(), [], 0, self.parker.host
        for slot in self.idle_lru.values():
            if now - slot.last_active < idle_s:
                break
            more = host.pages_for(slot.committed_len)
            if not host.can_hold(len(batch) + 1, pages + more):
                break
            batch.append(slot)
            pages += more
        self.park(batch)
        return len(batch)

    # ----- accounting -----------------------------------------------------------------------

    def stats(self) -> ParkingStats:
        if self.parker is None:
            return ParkingStats()
        return ParkingStats(
            len(self.parked),
            self.parker.parks_total,
            self.parker.restores_total,
            self.parker.restore_seconds.counts(),
        )

    def host_held_tokens(self) -> int:
        """Host KV token slots (whole pages) parked sessions hold."""
        page = self.kv.page_size
        return sum(slot.host.kv_pages.numel() for slot in self.parked.values()) * page
