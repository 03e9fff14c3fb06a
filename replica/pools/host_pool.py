"""``HostPools``: the host tier of one replica, where parked sessions keep their state.

``host_mamba`` has one slot per parked session (its live mamba state: conv and SSM state of every
mamba layer; the track buffer is only needed while a turn runs, so it is not kept) and
``host_kv_tokens`` holds the KV of their committed tokens, paged like the GPU KV pool (same page
size, so a page moves as one run). Both are ordinary ``MambaPool``/``KVTokenPool`` objects on the
CPU, in pinned memory when the GPU pools are on CUDA (so copies to and from the GPU are DMA), with
allocators of their own (``host_mamba``, ``host_kv_pages``).

A parked session owns exactly its ``HostSlots`` until it is restored or released.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from replica.api import PoolExhaustedError
from replica.config import PoolConfig
from replica.model.config import ModelConfig
from replica.pools.kv_pool import KVTokenPool, pages_for
from replica.pools.mamba_pool import MambaPool


class HostSlots(NamedTuple):
    """What a parked session holds in the host tier."""

    mamba_idx: int  # its live mamba state
    kv_pages: torch.Tensor  # int64 host KV pages of positions 0..committed_len-1, in order


class HostPools:
    def __init__(self, model: ModelConfig, pools: PoolConfig) -> None:
        if not pools.parking:
            raise ValueError("the host tier needs max_parked_sessions > 0")
        pin = torch.device(pools.device).type == "cuda"
        self.page_size = pools.page_size
        self.mamba = MambaPool(
            model, pools.max_parked_sessions, pools.state_torch_dtype, "cpu", "host_mamba", pin
        )
        self.kv = KVTokenPool(
            model,
            pools.host_kv_pages * pools.page_size,
            pools.page_size,
            pools.kv_torch_dtype,
            "cpu",
            "host_kv_pages",
            pin,
        )

    def pages_for(self, committed_len: int) -> int:
        return pages_for(committed_len, self.page_size)

    def can_hold(self, sessions: int, pages: int) -> bool:
        """Room for ``sessions`` more parked sessions holding ``pages`` KV pages in all."""
        return self.mamba.can_alloc(sessions) and self.kv.page_allocator.can_alloc(pages)

    def alloc(self, page_counts: list[int], zeroed: bool = False) -> list[HostSlots]:
        """Host slots for sessions of ``page_counts`` KV pages each; all-or-nothing (raises
        ``PoolExhaustedError`` and takes nothing). The mamba slots are zeroed (a new session's
        initial state) only when ``zeroed``; parking overwrites them."""
        if not self.can_hold(len(page_counts), sum(page_counts)):
            raise PoolExhaustedError(
                f"host tier full: {len(page_counts)} sessions with {sum(page_counts)} KV pages "
                f"do not fit in {self.mamba.num_free} free host_mamba slots and "
                f"{self.kv.page_allocator.num_free} free host KV pages"
            )
        mamba = self.mamba.alloc(len(page_counts), zeroed).tolist()
        pages = self.kv.page_allocator.alloc(sum(page_counts)).split(page_counts)
        return [HostSlots(m, p) for m, p in zip(mamba, pages)]

    def free(self, slots: list[HostSlots]) -> None:
        """Give back parked sessions' host slots (validated before anything changes)."""
        if not slots:
            return
        pages = torch.cat([s.kv_pages for s in slots])
        self.mamba.allocator.free([s.mamba_idx for s in slots])
        self.kv.page_allocator.free(pages)

    def check_integrity(self) -> None:
        self.mamba.check_integrity()
        self.kv.check_integrity()
