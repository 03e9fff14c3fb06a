"""``ReqToTokenPool``: one row per live sequence mapping its positions to KV token slots.

``req_to_token[row, pos]`` is the KV token slot of position ``pos`` of the sequence that owns
``row``. A row is owned by exactly one running request or idle session; entries beyond the
owner's allocated length are meaningless.

With ``scratch``, one more row (``scratch_row``, index ``rows``) lies beyond the allocator: never
handed out or counted, it is what the padding rows of a decode batch padded to a fixed size read
(its owner fills it with the KV pool's scratch slot).
"""

from __future__ import annotations

import torch

from replica.pools.slot_allocator import SlotAllocator


class ReqToTokenPool:
    def __init__(
        self, rows: int, max_context_len: int, device: str = "cpu", scratch: bool = False
    ) -> None:
        self.rows = rows
        self.max_context_len = max_context_len
        self.scratch_row = rows if scratch else None
        self.req_to_token = torch.zeros(
            (rows + scratch, max_context_len), dtype=torch.int32, device=device
        )
        self.row_allocator = SlotAllocator(rows, "req")

    @property
    def num_free(self) -> int:
        return self.row_allocator.num_free

    def can_alloc(self, n: int) -> bool:
        return self.row_allocator.can_alloc(n)

    def alloc_rows(self, n: int) -> torch.Tensor:
        return self.row_allocator.alloc(n)

    def free_rows(self, rows: torch.Tensor | list[int] | int) -> None:
        self.row_allocator.free(rows)

    def check_integrity(self) -> None:
        self.row_allocator.check_integrity()
