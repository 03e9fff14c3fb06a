"""A free list of integer slots with reference counts, in O(batch) array operations.

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

The allocator lives on the CPU even when the tensors it indexes live on a GPU, and its
bookkeeping is numpy arrays: a handful of array ops per call, never a Python loop over slots.
Numpy rather than torch because a call names few slots, so the cost is per op, and a numpy op
on a few elements costs a fraction of a torch op's dispatch (``bench.pool_ops``). Slots go out
as int64 torch tensors and come back as tensors (any device), lists or ints.
"""

from __future__ import annotations

import numpy as np
import torch

from replica.api import PoolExhaustedError, SlotStateError

Slots = torch.Tensor | list[int] | int


class SlotAllocator:
    def __init__(self, size: int, name: str) -> None:
        if size <= 0:
            raise ValueError(f"{name}: size must be positive, got {size}")
        self.size = size
        self.name = name
        # stack[:num_free] are the free slots; the top of the stack is stack[num_free - 1].
        self._stack = np.arange(size - 1, -1, -1, dtype=np.int64)
        self._refs = np.zeros(size, dtype=np.int64)
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
        taken = self._stack[start : self._num_free][::-1].copy()
        self._num_free = start
        self._refs[taken] = 1
        return torch.from_numpy(taken)

    def share(self, idx: Slots) -> None:
        """One more holder for each occurrence of an allocated slot in ``idx``."""
        idx = self._checked(idx)
        if idx.size == 0:
            return
        free = self._refs[idx] == 0
        if free.any():
            bad = idx[free].tolist()
            raise SlotStateError(f"{self.name}: cannot share slots that are free: {bad}")
        np.add.at(self._refs, idx, 1)
        self._extra_refs += idx.size

    def free(self, idx: Slots) -> None:
        """Drop one holder per occurrence in ``idx``; slots left with none are free again.
        Validates everything before changing anything."""
        idx = self._checked(idx)
        if idx.size == 0:
            return
        slots, drops, where = _occurrences(idx)
        refs = self._refs[slots]
        short = refs < drops
        if short.any():
            raise SlotStateError(
                f"{self.name}: double free or free of a slot never allocated: "
                f"{slots[short].tolist()}"
            )
        left = refs - drops
        self._refs[slots] = left
        gone = left == 0
        if where is not None:
            gone = gone[where]  # per occurrence, in the caller's order
        freed = idx[gone]
        if where is not None and freed.size:  # a freed slot named more than once: keep its first
            freed = np.fromiter(dict.fromkeys(freed.tolist()), np.int64)
        n = freed.size
        self._extra_refs -= idx.size - n  # every drop but a slot's last was an extra holder
        self._stack[self._num_free : self._num_free + n] = freed[::-1]
        self._num_free += n

    def refcount(self, idx: int) -> int:
        return int(self._refs[idx])

    def refcounts(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self._refs[self._checked(idx)])

    def is_allocated(self, idx: int) -> bool:
        return bool(self._refs[idx] > 0)

    def _checked(self, idx: Slots) -> np.ndarray:
        if isinstance(idx, torch.Tensor):
            idx = idx.detach().cpu().numpy()
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.size):
            raise SlotStateError(
                f"{self.name}: slot index out of range 0..{self.size - 1}: {idx.tolist()}"
            )
        return idx

    def check_integrity(self) -> None:
        """The free stack and the reference counts must describe the same partition of slots,
        and the count of extra holders must match the counts."""
        free = self._stack[: self._num_free]
        if np.unique(free).size != self._num_free:
            raise SlotStateError(f"{self.name}: duplicate slots on the free list")
        if (self._refs < 0).any():
            raise SlotStateError(f"{self.name}: a reference count is below zero")
        if (self._refs[free] != 0).any():
            raise SlotStateError(f"{self.name}: a slot is both free and allocated")
        held = int(np.count_nonzero(self._refs))
        if held != self.size - self._num_free:
            raise SlotStateError(f"{self.name}: allocated slots disagree with the free count")
        if int(self._refs.sum()) - held != self._extra_refs:
            raise SlotStateError(f"{self.name}: shared holders disagree with the counts")


def _occurrences(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | int, np.ndarray | None]:
    """``(slots, drops, where)``: each distinct slot of ``idx``, how often it occurs, and for each
    occurrence its slot's place in ``slots`` (None when no slot occurs twice: then ``slots`` is
    ``idx`` itself, in its order, and ``drops`` 1), so the common case costs one sort."""
    if idx.size > 1:
        ordered = np.sort(idx)
        if (ordered[1:] == ordered[:-1]).any():
            slots, where, drops = np.unique(idx, return_inverse=True, return_counts=True)
            return slots, drops, where
    return idx, 1, None
