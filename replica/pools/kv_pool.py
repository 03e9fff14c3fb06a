"""The KV token pool: per attention layer K and V buffers, allocated in pages of ``page_size``.

Token slot ``s`` lives in page ``s // page_size``. A sequence of length ``L`` holds
``ceil(L / page_size)`` whole pages; positions of one page are contiguous slots, so position
``p`` of a sequence maps to ``page_of(p // page_size) * page_size + p % page_size``.

Frees are page-aligned: truncating a sequence frees only the pages that lie wholly beyond the new
length; the page holding its last kept position stays with it. Accounting is in token slots
(whole pages times ``page_size``), so ``capacity == free + in_use + session_held`` holds exactly.

Pages are reference counted (``SlotAllocator``): ``share_prefix`` gives a second row the whole
pages of another row's first positions (a fork), and copies nothing; only the last, partly filled
page gets a fresh page of its own, whose contents the caller copies (copy-on-write done eagerly:
a shared page is never written, because every row only ever writes positions past its own
length, and the only page holding such positions is its own). Freeing drops a holder; a page is
free when its last holder frees it. A shared page is counted once (``distinct_pages``).

With ``scratch``, one more page lies beyond the allocator (its first slot is ``scratch_slot``):
never handed out or counted, it is where the padding rows of a decode batch padded to a fixed size
write their K/V and what they read.
"""

from __future__ import annotations

import numpy as np
import torch

from replica.model.config import ModelConfig
from replica.pools.slot_allocator import SlotAllocator


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class KVTokenPool:
    def __init__(
        self,
        model: ModelConfig,
        token_slots: int,
        page_size: int,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        name: str = "kv_pages",
        pin_memory: bool = False,
        scratch: bool = False,
    ) -> None:
        if token_slots % page_size:
            raise ValueError(f"token_slots {token_slots} is not a multiple of page {page_size}")
        self.page_size = page_size
        self.token_slots = token_slots
        self.device = device
        self.scratch_slot = token_slots if scratch else None
        # One tensor per kind for all layers (as MambaPool), so moving a session's KV between
        # pools is one op per kind; ``k[j]``/``v[j]`` are the per-layer views the model uses.
        held = token_slots + (page_size if scratch else 0)
        shape = (model.num_attn_layers, held, model.num_key_value_heads, model.head_dim)
        self.k_all, self.v_all = (
            torch.zeros(shape, dtype=dtype, device=device, pin_memory=pin_memory) for _ in range(2)
        )
        self.k = list(self.k_all.unbind(0))
        self.v = list(self.v_all.unbind(0))
        self.page_allocator = SlotAllocator(token_slots // page_size, name)

    @property
    def free_tokens(self) -> int:
        return self.page_allocator.num_free * self.page_size

    def held_tokens(self, length: int) -> int:
        """Token slots a sequence of ``length`` positions holds (whole pages)."""
        return pages_for(length, self.page_size) * self.page_size

    def tokens_needed(self, old_len: int, new_len: int) -> int:
        """Free token slots that growing a sequence from ``old_len`` to ``new_len`` takes."""
        return self.held_tokens(new_len) - self.held_tokens(old_len)

    def can_extend(self, old_len: int, new_len: int) -> bool:
        return self.tokens_needed(old_len, new_len) <= self.free_tokens

    def extend(self, req_to_token: torch.Tensor, row: int, old_len: int, new_len: int) -> None:
        """Give positions ``old_len..new_len-1`` of ``row`` KV slots. All-or-nothing.

        When ``row``'s last page is partly filled and shared with another row (a truncation
        below a fork point), it is copied to a fresh page first (copy-on-write): a shared page
        is never written."""
        if new_len <= old_len:
            return
        p = self.page_size
        first_new_page = pages_for(old_len, p)
        first_ord = old_len // p
        last_page = int(req_to_token[row, old_len - 1]) // p if first_ord < first_new_page else -1
        shared = self.page_allocator.shared_refs > 0  # a plain int: no tensor op when not
        cow = last_page >= 0 and shared and self.page_allocator.refcount(last_page) > 1
        new_pages = self.page_allocator.alloc(pages_for(new_len, p) - first_new_page + int(cow))
        if cow:
            last_page = self._copy_on_write(
                req_to_token, row, last_page, int(new_pages[0]), old_len
            )
            new_pages = new_pages[1:]
        pages = new_pages.numpy()
        if last_page >= 0:  # the last page is partly filled: keep filling it
            pages = np.concatenate(([last_page], pages))
        # host-side arithmetic on a few positions (numpy: a fraction of torch's per-op cost),
        # then one copy into the row
        positions = np.arange(old_len, new_len)
        slots = (pages[positions // p - first_ord] * p + positions % p).astype(np.int32)
        req_to_token[row, old_len:new_len] = torch.from_numpy(slots)

    def _copy_on_write(
        self, req_to_token: torch.Tensor, row: int, shared: int, fresh: int, length: int
    ) -> int:
        """Move ``row``'s filled positions of the shared page ``shared`` into ``fresh``."""
        p, used = self.page_size, length % self.page_size
        for kv in (self.k_all, self.v_all):
            kv[:, fresh * p : fresh * p + used] = kv[:, shared * p : shared * p + used]
        start = length - used
        fresh_slots = torch.arange(fresh * p, fresh * p + used, dtype=torch.int32)
        req_to_token[row, start:length] = fresh_slots.to(req_to_token.device)
        self.page_allocator.free([shared])  # this row's hold on it
        return fresh

    def truncate(self, req_to_token: torch.Tensor, row: int, keep_len: int, cur_len: int) -> None:
        """Free the pages of ``row`` that lie wholly beyond ``keep_len`` (of ``cur_len``)."""
        self.page_allocator.free(self.pages_of(req_to_token, row, keep_len, cur_len))

    def pages_of(
        self, req_to_token: torch.Tensor, row: int, keep_len: int, cur_len: int
    ) -> torch.Tensor:
        """The pages of ``row`` that lie wholly beyond ``keep_len`` (of ``cur_len``), in order."""
        p = self.page_size
        first, last = pages_for(keep_len, p), pages_for(cur_len, p)
        if last <= first:
            return torch.empty(0, dtype=torch.int64)
        firsts = req_to_token[row, first * p : last * p : p]  # each page's first slot
        return torch.from_numpy((firsts.cpu().numpy() // p).astype(np.int64))

    def share_prefix(
        self, req_to_token: torch.Tensor, src_row: int, dst_row: int, length: int
    ) -> tuple[int, int] | None:
        """Give ``dst_row`` (holding nothing) the KV of ``src_row``'s positions ``0..length-1``:
        its whole pages shared, its last partial page (if any) a fresh page of ``dst_row``'s own.
        Returns ``(src page, dst page)`` of that partial page, whose contents the caller copies,
        or None. All-or-nothing (``PoolExhaustedError`` when no page is free for the copy)."""
        p = self.page_size
        whole = length // p * p
        partial = None
        if whole < length:
            self.extend(req_to_token, dst_row, whole, length)  # the one page it allocates
            src_page = int(req_to_token[src_row, whole]) // p
            partial = (src_page, int(req_to_token[dst_row, whole]) // p)
        if whole:
            self.page_allocator.share(self.pages_of(req_to_token, src_row, 0, whole))
            req_to_token[dst_row, :whole] = req_to_token[src_row, :whole]
        return partial

    def hold_prefix(self, req_to_token: torch.Tensor, row: int, length: int) -> torch.Tensor:
        """The KV of ``row``'s positions ``0..length-1`` for a holder that is not a row (a cached
        state): its whole pages shared, its last partial page (if any) copied into a fresh page
        of the holder's own (the row goes on writing that one). Returns the holder's pages in
        order. All-or-nothing (``PoolExhaustedError`` when no page is free for the copy)."""
        p = self.page_size
        fresh = self.page_allocator.alloc(1 if length % p else 0)
        pages = self.pages_of(req_to_token, row, 0, length)
        if fresh.numel():
            self._copy_page(int(pages[-1]), int(fresh[0]), length % p)
            pages = torch.cat([pages[:-1], fresh])
        self.page_allocator.share(pages[: length // p])
        return pages

    def lend_pages(
        self, req_to_token: torch.Tensor, row: int, pages: torch.Tensor, length: int
    ) -> None:
        """Give ``row`` (holding nothing) the KV of positions ``0..length-1`` held in ``pages``
        (a cached state's): the whole pages shared, the last partial one copied into a fresh
        page of the row's own, which it will write past. All-or-nothing."""
        p = self.page_size
        whole = length // p
        fresh = self.page_allocator.alloc(1 if length % p else 0)
        if fresh.numel():
            self._copy_page(int(pages[whole]), int(fresh[0]), length % p)
        self.page_allocator.share(pages[:whole])
        mine = torch.cat([pages[:whole], fresh])
        positions = torch.arange(length, dtype=torch.int64)
        slots = mine[positions // p] * p + positions % p
        req_to_token[row, :length] = slots.to(req_to_token.device, torch.int32)

    def _copy_page(self, src: int, dst: int, used: int) -> None:
        """Copy the first ``used`` positions of page ``src`` into page ``dst``, every layer."""
        p = self.page_size
        for kv in (self.k_all, self.v_all):
            kv[:, dst * p : dst * p + used] = kv[:, src * p : src * p + used]

    def freed_by_release(self, req_to_token: torch.Tensor, row: int, length: int) -> int:
        """Token slots that freeing ``row``'s positions ``0..length-1`` would give back: its
        pages that no other row shares."""
        if not self.page_allocator.shared_refs:
            return self.held_tokens(length)
        pages = self.pages_of(req_to_token, row, 0, length)
        only = int((self.page_allocator.refcounts(pages) == 1).sum())
        return only * self.page_size

    def distinct_pages(
        self, req_to_token: torch.Tensor, rows: list[tuple[int, int]]
    ) -> torch.Tensor:
        """The distinct pages (sorted) that rows ``(row, length)`` hold: a page shared by
        several of them once."""
        pages = [self.pages_of(req_to_token, row, 0, n) for row, n in rows]
        if not pages:
            return torch.empty(0, dtype=torch.int64)
        return torch.unique(torch.cat(pages))

    def check_integrity(self) -> None:
        self.page_allocator.check_integrity()
