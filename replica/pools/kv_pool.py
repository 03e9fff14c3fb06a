"""The KV token pool: per attention layer K and V buffers, allocated in pages of ``page_size``.

Token slot ``s`` lives in page ``s // page_size``. A sequence of length ``L`` holds
``ceil(L / page_size)`` whole pages; positions of one page are contiguous slots, so position
``p`` of a sequence maps to ``page_of(p // page_size) * page_size + p % page_size``.

Frees are page-aligned: truncating a sequence frees only the pages that lie wholly beyond the new
length; the page holding its last kept position stays with it. Accounting is in token slots
(whole pages times ``page_size``), so ``capacity == free + in_use + session_held`` holds exactly.
"""

from __future__ import annotations

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
    ) -> None:
        if token_slots % page_size:
            raise ValueError(f"token_slots {token_slots} is not a multiple of page {page_size}")
        self.page_size = page_size
        self.token_slots = token_slots
        self.device = device
        # One tensor per kind for all layers (as MambaPool), so moving a session's KV between
        # pools is one op per kind; ``k[j]``/``v[j]`` are the per-layer views the model uses.
        shape = (model.num_attn_layers, token_slots, model.num_key_value_heads, model.head_dim)
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
        """Give positions ``old_len..new_len-1`` of ``row`` KV slots. All-or-nothing."""
        if new_len <= old_len:
            return
        p = self.page_size
        first_new_page = pages_for(old_len, p)
        new_pages = self.page_allocator.alloc(pages_for(new_len, p) - first_new_page)
        first_ord = old_len // p
        if first_ord < first_new_page:  # the last page is partly filled: keep filling it
            last_page = int(req_to_token[row, old_len - 1]) // p
            pages = torch.cat([torch.tensor([last_page], dtype=torch.int64), new_pages])
        else:
            pages = new_pages
        positions = torch.arange(old_len, new_len, dtype=torch.int64)
        slots = pages[positions // p - first_ord] * p + positions % p
        req_to_token[row, old_len:new_len] = slots.to(req_to_token.device, torch.int32)

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
        starts = torch.arange(first, last, dtype=torch.int64, device=req_to_token.device) * p
        return req_to_token[row].index_select(0, starts).to("cpu", torch.int64) // p

    def check_integrity(self) -> None:
        self.page_allocator.check_integrity()
