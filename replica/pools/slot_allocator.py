"""A free list of integer slots with double-free detection, in O(batch) tensor operations.

Contract:
- Slots are ``0 .. size-1``. The free list is a LIFO stack: the slot freed last is handed out
  first (warm memory), and a new allocator hands out ``0, 1, 2, ...`` in that order.
- ``alloc(n)`` is all-or-nothing: it raises ``PoolExhaustedError`` and takes nothing when fewer
  than ``n`` slots are free. Callers that must not fail check ``can_alloc`` first.
- ``free(idx)`` raises ``SlotStateError`` and frees nothing when any index is out of range,
  repeated, or not currently allocated (double free, or a slot never handed out).
- The caller that receives a slot owns it until it frees it; the allocator only tracks that
  somebody does.

The allocator lives on the CPU even when the tensors it indexes live on a GPU: its bookkeeping
is a handful of tiny tensor ops per call, never a Python loop over slots.
"""

from __future__ import annotations

import torch

from replica.api import PoolExhaustedError, SlotStateError


class SlotAllocator:
    def __init__(self, size: int, name: str) -> None:
        if size <= 0:
            raise ValueError(f"{name}: size must be positive, got {size}")
        self.size = size
        self.name = name
        # stack[:num_free] are the free slots; the top of the stack is stack[num_free - 1].
        self._stack = torch.arange(size - 1, -1, -1, dtype=torch.int64)
        self._allocated = torch.zeros(size, dtype=torch.bool)
        self._num_free = size

    @property
    def num_free(self) -> int:
        return self._num_free

    def can_alloc(self, n: int) -> bool:
        return 0 <= n <= self._num_free

    def alloc(self, n: int) -> torch.Tensor:
        """Take ``n`` slots; returns an int64 tensor of them (empty for ``n == 0``)."""
        if n < 0:
            raise ValueError(f"{self.name}: cannot allocate {n} slots")
        if n > self._num_free:
            raise PoolExhaustedError(
                f"{self.name} pool exhausted: asked for {n} slots, {self._num_free} of "
                f"{self.size} free"
            )
        start = self._num_free - n
        taken = self._stack[start : self._num_free].flip(0).clone()
        self._num_free = start
        self._allocated[taken] = True
        return taken

    def free(self, idx: torch.Tensor | list[int] | int) -> None:
        """Give slots back. Validates everything before changing anything."""
        idx = torch.as_tensor(idx, dtype=torch.int64).reshape(-1).cpu()
        n = idx.numel()
        if n == 0:
            return
        if bool((idx < 0).any()) or bool((idx >= self.size).any()):
            raise SlotStateError(
                f"{self.name}: slot index out of range 0..{self.size - 1}: {idx.tolist()}"
            )
        if n > 1 and torch.unique(idx).numel() != n:
            raise SlotStateError(
                f"{self.name}: the same slot freed twice in one call: {idx.tolist()}"
            )
        held = self._allocated[idx]
        if not bool(held.all()):
            bad = idx[~held].tolist()
            raise SlotStateError(
                f"{self.name}: double free or free of a slot never allocated: {bad}"
            )
        self._allocated[idx] = False
        self._stack[self._num_free : self._num_free + n] = idx.flip(0)
        self._num_free += n

    def is_allocated(self, idx: int) -> bool:
        return bool(self._allocated[idx])

    def check_integrity(self) -> None:
        """The free stack and the allocated mask must describe the same partition of slots."""
        free = self._stack[: self._num_free]
        if torch.unique(free).numel() != self._num_free:
            raise SlotStateError(f"{self.name}: duplicate slots on the free list")
        if bool(self._allocated[free].any()):
            raise SlotStateError(f"{self.name}: a slot is both free and allocated")
        if int(self._allocated.sum()) != self.size - self._num_free:
            raise SlotStateError(f"{self.name}: allocated mask disagrees with the free count")
