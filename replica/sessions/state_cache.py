"""``StateCache``: states at turn boundaries, kept for new sessions whose prefix begins with them.

An entry (``CachedState``) is keyed by the exact tokens folded into its state (a pending token,
not folded yet, is not part of the key). It holds one mamba slot of its own (a copy of the
recurrent state: conv and temporal, every layer) and the KV pages of those tokens: the whole
pages shared by reference count with the sessions that hold them too, the last partial page a
copy of its own (as a fork does). An entry is never written: a session that starts from it
copies its mamba state into its own slot and shares its whole pages (the partial one copied), and
rows only ever write past their own length, into pages of their own.

Entries live in free room only. ``make_room`` evicts least recently used entries until what a
caller needs is free, and every path that needs GPU room (an open, a fork, an import, a restore,
a turn's KV, room made by parking) calls it first: a cached state never causes a refusal or a
park. At most ``max_entries`` entries (0: the cache is off). Entries are ``cached`` in the
accounting: one mamba slot each, and their KV pages that no running turn or idle session holds
(a shared page is counted once, where it is held). Engine thread only.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from replica.api import StateCacheStats
from replica.pools.hybrid_pool import HybridReqToTokenPool
from replica.prefix_hashes import block_tokens, chained_block_hashes

MAX_SNAPSHOT_HASHES = 1024  # block hashes a snapshot carries at most (most recent entries first)


@dataclass(slots=True, eq=False)
class CachedState:
    tokens: tuple[int, ...]  # folded into the state: KV positions 0..len-1
    mamba_idx: int  # its own copy of the recurrent state
    pages: torch.Tensor  # int64 pages of positions 0..len-1 (a partial last page its own)
    hashes: tuple[int, ...]  # chained block hashes of ``tokens``


class StateCache:
    def __init__(self, pool: HybridReqToTokenPool, max_entries: int) -> None:
        self.pool = pool
        self.kv = pool.kv_pool
        self.mamba = pool.mamba_pool
        self.max_entries = max_entries
        self.block = block_tokens(self.kv.page_size)
        self.entries: OrderedDict[tuple[int, ...], CachedState] = OrderedDict()  # LRU first
        self._lengths: Counter[int] = Counter()  # entries by key length (what lookups try)
        self._hashes: frozenset[int] | None = frozenset()  # None: to be recomputed
        self.hits_total = self.misses_total = self.evictions_total = 0
        self.reused_tokens_total = 0

    def __len__(self) -> int:
        return len(self.entries)

    def keep(self, tokens: tuple[int, ...], row: int, state: int) -> CachedState | None:
        """Cache the state in mamba slot ``state`` whose KV is ``row``'s positions
        ``0..len(tokens)-1``, keyed by ``tokens``; an entry with that key is only marked
        recently used. Never raises for room and never takes room it would have to make by
        anything but evicting its own entries: None when the state is not kept."""
        n = len(tokens)
        if not self.max_entries or not n:
            return None
        entry = self.entries.get(tokens)
        if entry is not None:
            self.entries.move_to_end(tokens)
            return entry
        if len(self.entries) >= self.max_entries:
            self.evict(next(iter(self.entries.values())))
        partial = self.kv.page_size if n % self.kv.page_size else 0
        if not self.make_room(0, partial, mamba=1):
            return None
        idx = int(self.mamba.alloc(1, zeroed=False)[0])
        try:
            pages = self.kv.hold_prefix(self.pool.req_to_token, row, n)
        except BaseException:
            self.mamba.free([idx])
            raise
        self.mamba.copy(state, idx)
        entry = CachedState(tokens, idx, pages, tuple(chained_block_hashes(tokens, self.block)))
        self.entries[tokens] = entry
        self._lengths[n] += 1
        self._hashes = None
        return entry

    def lookup(self, ids: Sequence[int]) -> CachedState | None:
        """The entry with the longest key that begins ``ids`` (counted as a hit, marked recently
        used), or None (a miss)."""
        for n in sorted((n for n in self._lengths if n <= len(ids)), reverse=True):
            entry = self.entries.get(tuple(ids[:n]))
            if entry is not None:
                self.entries.move_to_end(entry.tokens)
                self.hits_total += 1
                return entry
        self.misses_total += 1
        return None

    def give(self, entry: CachedState, row: int, state: int) -> bool:
        """Start the sequence in ``row`` (holding no KV yet) and mamba slot ``state`` from
        ``entry``: its state copied, its KV pages shared. False (nothing changed) when no page is
        free for the copy of its partial page, even after evicting other entries."""
        n = len(entry.tokens)
        partial = self.kv.page_size if n % self.kv.page_size else 0
        if not self.make_room(0, partial, keep=entry):
            return False
        self.kv.lend_pages(self.pool.req_to_token, row, entry.pages, n)
        self.mamba.copy(entry.mamba_idx, state)
        self.reused_tokens_total += n
        return True

    def make_room(
        self, seqs: int, kv_tokens: int, mamba: int = 0, keep: CachedState | None = None
    ) -> bool:
        """Evict least recently used entries (never ``keep``) until ``seqs`` more sequences,
        ``mamba`` more mamba slots and ``kv_tokens`` more KV token slots are free; returns
        whether they are."""
        per_seq = self.pool.slots_per_seq
        for entry in list(self.entries.values()):
            if self._fits(seqs, kv_tokens, seqs * per_seq + mamba):
                return True
            if entry is not keep:
                self.evict(entry)
        return self._fits(seqs, kv_tokens, seqs * per_seq + mamba)

    def _fits(self, seqs: int, kv_tokens: int, mamba: int) -> bool:
        return (
            self.pool.num_free >= seqs
            and self.mamba.num_free >= mamba
            and self.kv.free_tokens >= kv_tokens
        )

    def evict(self, entry: CachedState) -> None:
        del self.entries[entry.tokens]
        self._lengths[len(entry.tokens)] -= 1
        if not self._lengths[len(entry.tokens)]:
            del self._lengths[len(entry.tokens)]
        self.mamba.free([entry.mamba_idx])
        self.kv.page_allocator.free(entry.pages)
        self.evictions_total += 1
        self._hashes = None

    def clear(self) -> None:
        for entry in list(self.entries.values()):
            self.evict(entry)

    # ----- accounting -----------------------------------------------------------------------

    def page_lists(self) -> list[torch.Tensor]:
        """Every entry's pages (a page two entries share appears twice)."""
        return [entry.pages for entry in self.entries.values()]

    def held_tokens(self) -> int:
        """KV token slots the entries' pages make, each entry's counted in full."""
        return sum(entry.pages.numel() for entry in self.entries.values()) * self.kv.page_size

    def stats(self) -> StateCacheStats:
        if self._hashes is None:
            hashes: set[int] = set()
            for entry in reversed(self.entries.values()):
                if len(hashes) + len(entry.hashes) > MAX_SNAPSHOT_HASHES:
                    break
                hashes.update(entry.hashes)
            self._hashes = frozenset(hashes)
        return StateCacheStats(
            len(self.entries),
            self.max_entries,
            self.hits_total,
            self.misses_total,
            self.evictions_total,
            self.reused_tokens_total,
            self.block,
            self._hashes,
        )
