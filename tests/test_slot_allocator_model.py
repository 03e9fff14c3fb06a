"""Property-based test of ``SlotAllocator`` alone against a plain model: a reference count per
slot and a LIFO list of free slots, in Python.

Random allocations (all-or-nothing), shares and frees, valid and not: frees name slots in any
order, the same slot several times (a page shared by several sequences freed in one call),
slots never handed out, and come as lists, int64 or int32 tensors and strided views. After every
step the allocator's counts, its free count and its extra holders equal the model's, and a
refused call changed nothing. Allocations must hand out exactly what the model's stack says
(the slot freed last first; a slot named twice in one free goes back once, at its first place),
and a tensor handed out earlier never changes under later calls.
"""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from replica.api import PoolExhaustedError, SlotStateError
from replica.pools.slot_allocator import SlotAllocator

SIZE = 12
FORMS = ("list", "int64", "int32", "strided")


def as_form(slots: list[int], form: str) -> list[int] | torch.Tensor:
    if form == "list":
        return slots
    if form == "strided":  # every other element of a longer tensor: not contiguous
        spread = torch.tensor([x for s in slots for x in (s, -1)], dtype=torch.int64)
        return spread[::2]
    return torch.tensor(slots, dtype=torch.int64 if form == "int64" else torch.int32)


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(SIZE, "t")
        self.refs: Counter[int] = Counter()  # the model: holders per slot
        self.free_stack = list(range(SIZE - 1, -1, -1))  # top is the end
        self.handed_out: list[tuple[torch.Tensor, list[int]]] = []

    @rule(n=st.integers(0, SIZE + 2))
    def allocate(self, n: int) -> None:
        if n > len(self.free_stack):
            before = self.alloc.num_free
            try:
                self.alloc.alloc(n)
            except PoolExhaustedError:
                assert self.alloc.num_free == before
                return
            raise AssertionError("an allocation beyond the free slots went through")
        got = self.alloc.alloc(n)
        expected = [self.free_stack.pop() for _ in range(n)]
        assert got.dtype == torch.int64 and got.tolist() == expected
        for s in expected:
            self.refs[s] = 1
        self.handed_out.append((got, list(expected)))

    @rule(data=st.data(), form=st.sampled_from(FORMS))
    def share(self, data: st.DataObject, form: str) -> None:
        slots = data.draw(st.lists(st.integers(0, SIZE - 1), max_size=4))
        if any(self.refs[s] == 0 for s in slots):
            with_free = self._refused(lambda: self.alloc.share(as_form(slots, form)))
            assert with_free, "sharing a free slot went through"
            return
        self.alloc.share(as_form(slots, form))
        for s in slots:
            self.refs[s] += 1

    @rule(data=st.data(), form=st.sampled_from(FORMS))
    def free(self, data: st.DataObject, form: str) -> None:
        held = sorted(s for s, n in self.refs.items() if n)
        pick = st.sampled_from(held) if held else st.integers(0, SIZE - 1)
        slots = data.draw(st.lists(pick | st.integers(-2, SIZE + 1), max_size=6))
        drops = Counter(slots)
        valid = all(0 <= s < SIZE and self.refs[s] >= n for s, n in drops.items())
        if not valid:
            assert self._refused(lambda: self.alloc.free(as_form(slots, form)))
            return
        self.alloc.free(as_form(slots, form))
        for s in slots:
            self.refs[s] -= 1
        # the slots left with no holder, each at its first place in the call
        freed = [s for s in dict.fromkeys(slots) if self.refs[s] == 0]
        self.free_stack.extend(reversed(freed))  # the caller's first freed slot on top

    def _refused(self, call) -> bool:
        """Whether ``call`` raised ``SlotStateError`` and left everything as it was."""
        before = (self.alloc.num_free, self.alloc.shared_refs, self._counts())
        try:
            call()
        except SlotStateError:
            assert (self.alloc.num_free, self.alloc.shared_refs, self._counts()) == before
            return True
        return False

    def _counts(self) -> list[int]:
        return [self.alloc.refcount(s) for s in range(SIZE)]

    @invariant()
    def matches_the_model(self) -> None:
        assert self._counts() == [self.refs[s] for s in range(SIZE)]
        assert self.alloc.num_free == len(self.free_stack)
        assert self.alloc.shared_refs == sum(max(n - 1, 0) for n in self.refs.values())
        for got, expected in self.handed_out:
            assert got.tolist() == expected  # never aliased to the allocator's own arrays
        self.alloc.check_integrity()


def test_slot_allocator_matches_its_model() -> None:
    run_state_machine_as_test(
        AllocatorMachine, settings=settings(max_examples=150, stateful_step_count=40, deadline=None)
    )
