"""``StateCopier``: slots' state copied between pools, bit for bit, by both of its paths."""

from __future__ import annotations

import pytest
import torch

from replica.pools.state_copy import StateCopier, contiguous_runs


def random_pool(layers: int, slots: int, state: tuple[int, ...], dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((layers, slots, *state), generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "copier",
    [
        StateCopier(staging_bytes=4096, direct_bytes=4096),  # staged, many chunks per copy
        StateCopier(staging_bytes=4096, direct_bytes=64),  # direct runs
    ],
    ids=["staged", "direct"],
)
def test_copies_exactly_the_given_slots_of_every_layer(copier, dtype):
    src = random_pool(3, 40, (4, 8), dtype, seed=1)  # 32 elements: 64 or 128 bytes a slot
    dst = random_pool(3, 30, (4, 8), dtype, seed=2)
    before = dst.clone()
    src_slots = torch.tensor([39, 0, 17, 5, 22, 8, 31, 2, 11, 26])
    dst_slots = torch.tensor([3, 29, 0, 14, 7, 21, 9, 18, 25, 1])
    copied = copier.copy(src, src_slots, dst, dst_slots)
    assert copied == 3 * 10 * 32 * src.element_size()
    assert torch.equal(dst[:, dst_slots], src[:, src_slots])
    untouched = torch.ones(30, dtype=torch.bool)
    untouched[dst_slots] = False
    assert torch.equal(dst[:, untouched], before[:, untouched])


def test_staged_copy_spans_several_staging_buffers():
    copier = StateCopier(staging_bytes=512, direct_bytes=256)  # 2 slots x 2 layers a chunk
    src = random_pool(2, 16, (32,), torch.float32, seed=3)
    dst = torch.zeros(2, 16, 32)
    slots = torch.randperm(16, generator=torch.Generator().manual_seed(4))
    copier.copy(src, slots, dst, torch.arange(16))
    assert torch.equal(dst, src[:, slots])


def test_nothing_to_copy_and_mismatches():
    copier = StateCopier()
    src, dst = torch.zeros(2, 4, 8), torch.zeros(2, 4, 8)
    none = torch.empty(0, dtype=torch.int64)
    assert copier.copy(src, none, dst, none) == 0
    one = torch.tensor([1])
    assert copier.copy(torch.zeros(0, 4, 8), one, torch.zeros(0, 4, 8), one) == 0  # no layers
    with pytest.raises(ValueError, match="cannot copy"):
        copier.copy(src, torch.tensor([0]), torch.zeros(2, 4, 9), torch.tensor([0]))
    with pytest.raises(ValueError, match="cannot copy"):
        copier.copy(src, torch.tensor([0]), dst.double(), torch.tensor([0]))
    with pytest.raises(ValueError, match="2 source slots for 1 targets"):
        copier.copy(src, torch.tensor([0, 1]), dst, torch.tensor([0]))
    with pytest.raises(ValueError, match="within one pool"):  # the Forker gathers, then scatters
        copier.copy(src, torch.tensor([0]), src, torch.tensor([1]))


def test_the_staging_buffer_grows_to_hold_one_slot_of_every_layer():
    copier = StateCopier(staging_bytes=64, direct_bytes=1 << 20)
    src = random_pool(6, 5, (16,), torch.float32, seed=5)  # 6 layers x 64 bytes a slot
    dst = torch.zeros(6, 5, 16)
    copier.copy(src, torch.tensor([4, 1, 3]), dst, torch.tensor([0, 2, 4]))
    assert torch.equal(dst[:, [0, 2, 4]], src[:, [4, 1, 3]])
    assert copier.staging.numel() == 6 * 64


def test_consecutive_slots_are_copied_as_one_run():
    assert contiguous_runs(
        torch.tensor([4, 5, 6, 9, 10, 11]), torch.tensor([0, 1, 2, 3, 7, 8])
    ) == [
        (4, 0, 3),
        (9, 3, 1),
        (10, 7, 2),
    ]
    copier = StateCopier(staging_bytes=4096, direct_bytes=64)
    src = random_pool(2, 12, (16,), torch.float32, seed=6)
    dst = torch.zeros(2, 12, 16)
    copier.copy(src, torch.tensor([4, 5, 6, 9, 10, 2]), dst, torch.tensor([0, 1, 2, 3, 7, 8]))
    assert torch.equal(dst[:, [0, 1, 2, 3, 7, 8]], src[:, [4, 5, 6, 9, 10, 2]])
