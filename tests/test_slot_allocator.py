import pytest
import torch

from replica.api import PoolExhaustedError, SlotStateError
from replica.pools.slot_allocator import SlotAllocator


def test_hands_out_in_order_then_lifo():
    alloc = SlotAllocator(8, "t")
    assert alloc.alloc(3).tolist() == [0, 1, 2]
    alloc.free([1])
    assert alloc.alloc(1).tolist() == [1]
    assert alloc.num_free == 5
    alloc.check_integrity()


def test_exhaustion_is_an_error_and_takes_nothing():
    alloc = SlotAllocator(4, "t")
    alloc.alloc(3)
    with pytest.raises(PoolExhaustedError, match="asked for 2 slots, 1 of 4 free"):
        alloc.alloc(2)
    assert alloc.num_free == 1
    alloc.check_integrity()


@pytest.mark.parametrize("bad", [[5], [-1], [0, 0], [3]])
def test_bad_free_raises_and_changes_nothing(bad):
    alloc = SlotAllocator(4, "t")
    alloc.alloc(3)  # 0, 1, 2 allocated; 3 never allocated
    with pytest.raises(SlotStateError):
        alloc.free(bad)
    assert alloc.num_free == 1
    alloc.check_integrity()


def test_double_free_raises():
    alloc = SlotAllocator(4, "t")
    slots = alloc.alloc(2)
    alloc.free(slots)
    with pytest.raises(SlotStateError, match="double free"):
        alloc.free(slots[:1])
    assert alloc.num_free == 4


def test_free_accepts_tensors_ints_and_empty():
    alloc = SlotAllocator(4, "t")
    slots = alloc.alloc(4)
    alloc.free(torch.tensor([], dtype=torch.int64))
    alloc.free(int(slots[0]))
    alloc.free(slots[1:])
    assert alloc.num_free == 4
    alloc.check_integrity()
