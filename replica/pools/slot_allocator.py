"""A free list of integer slots with reference counts, in O(batch) tensor operations.

Contract:
- Slots are ``0 .. size-1``. The free list is a LIFO stack: the slot freed last is handed out
  first (warm memory), and a new allocator hands out ``0, 1, 2, ...`` in that order.
- ``alloc(n)`` is all-or-nothing: it raises ``PoolExhaustedError`` and takes nothing when fewer
  than ``n`` slots are free. Callers that must not fail check ``can_alloc`` first. A slot handed
  out has one holder (reference count 1).
- ``share(idx)`` gives allocated slots one more holder each (a KV page shared by a forked
  session); sharing a free slot raises ``SlotStateError``.
- ``free(idx)`` drops one holder per occurrence of an index; a slot whose last holder lets go is
  free again. It raises ``SlotStateError`` and changes nothing when any index is out of range or
  would drop below zero holders (double free, or a slot never handed out). The same index twice
  in one call drops two holders, so a batch of sequences sharing a page frees it in one call.
- The caller that receives a slot (or shares it) holds it until it frees it; the allocator only
  counts how many do.

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
        self._refs = torch.zeros(size, dtype=torch.int64)
        self._num_free = size
        self._extra_refs = 0  # holders beyond the first, over all slots: 0 when nothing is shared

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def shared_refs(self) -> int:
        """Holders beyond the first, summed over all slots (0: no slot is shared)."""
        return self._extra_refs

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
        self._refs[taken] = 1
        return taken

    def share(self, idx: torch.Tensor | list[int] | int) -> None:
        """One more holder for each occurrence of an allocated slot in ``idx``."""
        idx = self._checked(idx)
        if idx.numel() == 0:
            return
        if not bool((self._refs[idx] > 0).all()):
            bad = idx[self._refs[idx] == 0].tolist()
            raise SlotStateError(f"{self.name}: cannot share slots that are free: {bad}")
        self._refs.index_add_(0, idx, torch.ones_like(idx))
        self._extra_refs += idx.numel()

    def free(self, idx: torch.Tensor | list[int] | int) -> None:
        """Drop one holder per occurrence in ``idx``; slots left with none are free again.
        Validates everything before changing anything."""
        idx = self._checked(idx)
        if idx.numel() == 0:
            return
        slots, where, drops = torch.unique(idx, return_inverse=True, return_counts=True)
        refs = self._refs[slots]
        if not bool((refs >= drops).all()):
            bad = slots[refs < drops].tolist()
            raise SlotStateError(
                f"{self.name}: double free or free of a slot never allocated: {bad}"
            )
        left = refs - drops
        self._refs[slots] = left
        n = int((left == 0).sum())
        self._extra_refs -= idx.numel() - n  # every drop but a slot's last was an extra holder
        if n:
            freed = idx[(left == 0)[where]]  # in the caller's order, as before sharing
            if freed.numel() != n:  # a freed slot named more than once: keep its first
                freed = torch.tensor(list(dict.fromkeys(freed.tolist())), dtype=torch.int64)
            self._stack[self._num_free : self._num_free + n] = freed.flip(0)
            self._num_free += n

    def refcount(self, idx: int) -> int:
        return int(self._refs[idx])

    def refcounts(self, idx: torch.Tensor) -> torch.Tensor:
        return self._refs[idx.to("cpu", torch.int64)]

    def is_allocated(self, idx: int) -> bool:
        return bool(self._refs[idx] > 0)

    def _checked(self, idx: torch.Tensor | list[int] | int) -> torch.Tensor:
        idx = torch.as_tensor(idx, dtype=torch.int64).reshape(-1).cpu()
        if idx.numel() and (bool((idx < 0).any()) or bool((idx >= self.size).any())):
            raise SlotStateError(
                f"{self.name}: slot index out of range 0..{self.size - 1}: {idx.tolist()}"
            )
        return idx

    def check_integrity(self) -> None:
        """The free stack and the reference counts must describe the same partition of slots,
        and the count of extra holders must match the counts."""
        free = self._stack[: self._num_free]
        if torch.unique(free).numel() != self._num_free:
            raise SlotStateError(f"{self.name}: duplicate slots on the free list")
        if bool((self._refs < 0).any()):
            raise SlotStateError(f"{self.name}: a reference count is below zero")
        if bool((self._refs[free] != 0).any()):
            raise SlotStateError(f"{self.name}: a slot is both free and allocated")
        held = self._refs > 0
        if int(held.sum()) != self.size - self._num_free:
            raise SlotStateError(f"{self.name}: allocated slots disagree with the free count")
        if int(self._refs.sum()) - int(held.sum()) != self._extra_refs:
            raise SlotStateError(f"{self.name}: shared holders disagree with the counts")
