import pytest
import torch

from replica.api import PoolExhaustedError, SlotStateError
from replica.pools.kv_pool import pages_for
from replica.sessions.request import Req
from tests.support.pools import assert_all_free, assert_consistent, make_pools


@pytest.mark.parametrize("page_size", [1, 16])
def test_kv_extend_and_truncate_are_page_aligned(page_size):
    pool, sessions, _ = make_pools(kv_tokens=256, page_size=page_size)
    kv, row = pool.kv_pool, int(pool.alloc_rows(1))
    kv.extend(pool.req_to_token, row, 0, 5)
    kv.extend(pool.req_to_token, row, 5, 40)
    slots = pool.req_to_token[row, :40].long()
    assert torch.unique(slots).numel() == 40
    # positions of one page are contiguous slots of that page
    pages = slots // page_size
    for ordinal in range(pages_for(40, page_size)):
        chunk = slots[ordinal * page_size : (ordinal + 1) * page_size]
        assert (chunk // page_size == pages[ordinal * page_size]).all()
        assert (chunk % page_size == torch.arange(chunk.numel())).all()
    assert kv.free_tokens == 256 - pages_for(40, page_size) * page_size
    kv.truncate(pool.req_to_token, row, 17, 40)  # keeps the page holding position 16
    assert kv.free_tokens == 256 - pages_for(17, page_size) * page_size
    kv.truncate(pool.req_to_token, row, 0, 17)
    assert kv.free_tokens == 256
    pool.free_rows(row)
    assert_all_free(pool, sessions)


def test_kv_extend_that_does_not_fit_takes_nothing():
    pool, sessions, _ = make_pools(kv_tokens=64, page_size=16)
    row = int(pool.alloc_rows(1))
    with pytest.raises(PoolExhaustedError):
        pool.kv_pool.extend(pool.req_to_token, row, 0, 65)
    assert pool.kv_pool.free_tokens == 64
    pool.free_rows(row)
    assert_all_free(pool, sessions)


def test_mamba_alloc_zeroes_and_copy_copies_every_layer():
    pool, sessions, _ = make_pools(track=1)
    mp = pool.mamba_pool
    a, b = mp.alloc(2).tolist()
    for conv, ssm in zip(mp.conv, mp.ssm):
        conv[a].fill_(3.0)
        ssm[a].fill_(4.0)
    mp.copy(a, b)
    assert all(bool((conv[b] == 3.0).all()) for conv in mp.conv)
    assert all(bool((ssm[b] == 4.0).all()) for ssm in mp.ssm)
    mp.free([a, b])
    (c,) = mp.alloc(1).tolist()  # LIFO: gets a slot just freed, which must come back zeroed
    assert all(float(ssm[c].abs().sum()) == 0.0 for ssm in mp.ssm)
    mp.free(c)
    assert_all_free(pool, sessions)


@pytest.mark.parametrize("track", [0, 1, 2])
def test_hybrid_alloc_gives_row_state_and_track_buffer(track):
    pool, sessions, _ = make_pools(max_sessions=3, track=track)
    seqs = pool.alloc_seqs(3)
    reqs = [Req("s", [1], seq=seq) for seq in seqs]
    held = [s.mamba_pool_idx for s in seqs] + [i for s in seqs for i in s.mamba_track_buffer]
    assert len(set(held)) == 3 * (1 + track)
    assert len({s.req_pool_idx for s in seqs}) == 3
    assert all(len(s.mamba_track_buffer) == track for s in seqs)
    assert_consistent(pool, sessions, reqs)
    with pytest.raises(PoolExhaustedError):
        pool.alloc_seqs(1)
    for seq in seqs:
        pool.free_seq(seq, 0)
    assert_all_free(pool, sessions)


def test_mamba_double_free_raises():
    pool, sessions, _ = make_pools()
    (seq,) = pool.alloc_seqs(1)
    pool.free_seq(seq, 0)
    with pytest.raises(SlotStateError):
        pool.free_mamba(seq)
    with pytest.raises(SlotStateError):
        pool.mamba_pool.free(pool.mamba_pool.slots - 1)  # never allocated
    assert_all_free(pool, sessions)
