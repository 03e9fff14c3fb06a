"""``HybridReqToTokenPool``: req rows, the mamba pool and the KV token pool of one replica.

Every sequence (a running request, or an idle session between turns) holds one req row, one
mamba slot for its live state (``mamba_pool_idx``) and ``mamba_track_buffers`` more mamba slots
(its track buffer; entry 0 holds the turn snapshot that makes turns atomic), plus the KV pages of
its positions. ``alloc_seqs`` is all-or-nothing; ``free_seq`` gives back all of it,
the mamba slots included.

Each pool has one scratch entry beyond its capacity (``scratch_row``, ``mamba_pool.scratch_slot``,
``kv_pool.scratch_slot``; the scratch row maps every position to the KV scratch slot): a decode
batch padded to a fixed size (``DecodeShapes``) points its padding rows there. They are never
allocated, so the accounting never sees them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from replica.api import PoolExhaustedError
from replica.config import PoolConfig
from replica.model.buffers import LayerBuffers
from replica.model.config import ModelConfig
from replica.pools.kv_pool import KVTokenPool
from replica.pools.mamba_pool import MambaPool
from replica.pools.req_to_token_pool import ReqToTokenPool


class SeqSlots(NamedTuple):
    """What one sequence holds in the row and mamba pools."""

    req_pool_idx: int
    mamba_pool_idx: int
    mamba_track_buffer: tuple[int, ...]


class HybridReqToTokenPool(ReqToTokenPool):
    def __init__(self, model: ModelConfig, pools: PoolConfig) -> None:
        super().__init__(pools.max_sessions, pools.max_context, pools.device, scratch=True)
        self.config = pools
        self.mamba_pool = MambaPool(
            model, pools.mamba_slots, pools.state_torch_dtype, pools.device, scratch=True
        )
        self.kv_pool = KVTokenPool(
            model,
            pools.kv_token_slots,
            pools.page_size,
            pools.kv_torch_dtype,
            pools.device,
            scratch=True,
        )
        self.req_to_token[self.scratch_row] = self.kv_pool.scratch_slot

    @property
    def slots_per_seq(self) -> int:
        return self.config.mamba_slots_per_seq

    def can_alloc(self, n: int) -> bool:
        return self.num_free >= n and self.mamba_pool.can_alloc(n * self.slots_per_seq)

    def alloc_seqs(self, n: int, zeroed: bool = True) -> list[SeqSlots]:
        """Rows and mamba slots for ``n`` sequences; all-or-nothing. The mamba slots are zeroed
        (a new sequence's initial state) unless the caller overwrites them (``zeroed=False``)."""
        if not self.can_alloc(n):
            raise PoolExhaustedError(
                f"no room for {n} more sequences: {self.num_free} req rows and "
                f"{self.mamba_pool.num_free} mamba slots free, each sequence needs 1 row and "
                f"{self.slots_per_seq} mamba slots"
            )
        rows = self.alloc_rows(n).tolist()
        mamba = self.mamba_pool.alloc(n * self.slots_per_seq, zeroed)
        # live states first, then the track buffers: a batch's live states are consecutive
        # slots (when the free list hands out a run), so moving them is one contiguous copy
        states, tracks = mamba[:n].tolist(), mamba[n:].view(n, self.slots_per_seq - 1).tolist()
        return [SeqSlots(row, m, tuple(t)) for row, m, t in zip(rows, states, tracks)]

    def free_seq(self, seq: SeqSlots, kv_len: int) -> None:
        """Free a sequence's KV pages (positions ``0..kv_len-1``), its row and its mamba slots."""
        self.free_seqs([seq], [kv_len])

    def free_seqs(self, seqs: list[SeqSlots], kv_lens: list[int]) -> None:
        """``free_seq`` for many sequences, one free per allocator."""
        pages = [
            self.kv_pool.pages_of(self.req_to_token, seq.req_pool_idx, 0, n)
            for seq, n in zip(seqs, kv_lens)
        ]
        self.kv_pool.page_allocator.free(torch.cat(pages))
        self.free_rows([seq.req_pool_idx for seq in seqs])
        self.mamba_pool.free(
            [i for seq in seqs for i in (seq.mamba_pool_idx, *seq.mamba_track_buffer)]
        )

    def free_mamba(self, seq: SeqSlots) -> None:
        self.mamba_pool.free([seq.mamba_pool_idx, *seq.mamba_track_buffer])

    @property
    def buffers(self) -> LayerBuffers:
        """The model's view of the state tensors."""
        return LayerBuffers(
            conv=self.mamba_pool.conv, ssm=self.mamba_pool.ssm, k=self.kv_pool.k, v=self.kv_pool.v
        )

    def check_integrity(self) -> None:
        super().check_integrity()
        self.mamba_pool.check_integrity()
        self.kv_pool.check_integrity()
