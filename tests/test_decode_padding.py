"""Decode batches padded to fixed shapes (what CUDA graphs replay), run here on the CPU: the
buckets, the pools' scratch entries the padding rows use, and an engine whose padded steps give
every turn the tokens and state of the unpadded engine while no other session's state moves."""

from __future__ import annotations

import pytest
import torch

from replica.api import SamplingParams
from replica.config import PoolConfig
from replica.engine.decode_shapes import DecodeShapes
from replica.model import build_tiny
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    greedy,
    make_engine,
    run_batch,
    run_turn,
    session_state,
    token_ids,
)
from tests.support.pools import make_pools


def test_every_batch_runs_the_smallest_bucket_that_holds_it():
    for max_rows in (1, 3, 8, 13, 64):
        shapes = DecodeShapes.padded(max_rows, max_width=1000)
        assert shapes.batches[-1] == max_rows
        for rows in range(1, max_rows + 1):
            fits = [b for b in shapes.batches if b >= rows]
            assert shapes.batch(rows) == min(fits)
            assert shapes.batch(rows) - rows < 8  # at most 7 padding rows
        assert len(shapes.batches) <= 3 + max_rows // 8 + 1


def test_widths_are_powers_of_two_up_to_the_context():
    shapes = DecodeShapes.padded(8, max_width=1000, min_width=64)
    assert [shapes.width(c) for c in (1, 64, 65, 128, 129, 511, 512, 513, 1000)] == [
        64,
        64,
        128,
        128,
        256,
        512,
        512,
        1000,
        1000,
    ]
    exact = DecodeShapes.exact(1000)
    assert not exact.pads
    assert [exact.batch(5), exact.width(77)] == [5, 77]


def test_scratch_entries_lie_beyond_every_allocator():
    pool, _, _ = make_pools(max_sessions=3, kv_tokens=64, page_size=16, track=1)
    mamba, kv = pool.mamba_pool, pool.kv_pool
    assert (pool.scratch_row, mamba.scratch_slot, kv.scratch_slot) == (3, 6, 64)
    assert pool.req_to_token.shape[0] == 4 and mamba.ssm_all.shape[1] == 7
    assert kv.k_all.shape[1] == 64 + 16  # one scratch page
    assert torch.all(pool.req_to_token[pool.scratch_row] == kv.scratch_slot)
    seqs = pool.alloc_seqs(3)
    rows = {s.req_pool_idx for s in seqs}
    slots = {i for s in seqs for i in (s.mamba_pool_idx, *s.mamba_track_buffer)}
    pages = kv.page_allocator.alloc(4).tolist()
    assert rows == {0, 1, 2} and slots == set(range(6)) and sorted(pages) == [0, 1, 2, 3]
    assert pool.num_free == mamba.num_free == kv.free_tokens == 0  # the scratch is not room
    kv.page_allocator.free(pages)
    pool.free_seqs(seqs, [0, 0, 0])
    pool.check_integrity()


def _engine(pad: bool, name: str = "tiny-bamba"):
    pools = PoolConfig(max_sessions=8, kv_tokens=4096, max_context=512, page_size=16)
    return make_engine(pools, build_tiny(name, seed=0), max_prefill_chunk=16, pad_decode=pad)


def _scratch_state(engine) -> list[torch.Tensor]:
    """The temporal state of the mamba pool's scratch slot, every recurrent layer."""
    scratch = engine.pool.mamba_pool.scratch_slot
    return [buf[scratch].clone() for buf in engine.pool.buffers.ssm]


def _turns(seed: int) -> dict[str, tuple[list[int], SamplingParams]]:
    """Three turns of different lengths and sampling, so the batch shrinks from 3 rows to 1."""
    return {
        "a": (token_ids(30, seed), greedy(9)),
        "b": (token_ids(5, seed + 1), SamplingParams(max_new_tokens=14, temperature=0.9, seed=3)),
        "c": (token_ids(70, seed + 2), SamplingParams(max_new_tokens=4, top_k=20, seed=4)),
    }


@pytest.mark.parametrize("name", ["tiny-bamba", "tiny-qwen3-next"])
def test_padded_steps_give_each_turn_the_unpadded_tokens_and_state(name):
    """Mamba2 and gated DeltaNet layers alike; the padding rows, marked inert, leave even the
    scratch slot's temporal state as it was (on a GPU the state is updated in place, where rows
    sharing a slot must not change it)."""
    results = []
    for pad in (False, True):
        engine = _engine(pad, name)
        assert engine.runner.shapes.pads == pad
        scratch = _scratch_state(engine)
        for sid in "abc":
            engine.open_session(sid)
        tokens = [run_batch(engine, _turns(10)), run_batch(engine, _turns(20))]
        results.append((tokens, {sid: session_state(engine, sid) for sid in "abc"}))
        assert all(map(torch.equal, _scratch_state(engine), scratch))
        close_and_check(engine)
    (want, want_states), (got, got_states) = results
    assert got == want
    for sid in "abc":
        assert_same_state(got_states[sid], want_states[sid])


def test_padding_rows_move_no_other_sessions_state():
    """An idle session holds the pools' first slots (row 0, mamba slot 0, KV page 0: where a
    padding row that missed the scratch entries would land); padded steps of other sessions
    leave its state bit for bit."""
    engine = _engine(pad=True)
    engine.open_session("idle")
    run_turn(engine, "idle", token_ids(20, 1), greedy(3))
    slot = engine.sessions.get("idle")
    assert slot.req_pool_idx == 0 and slot.seq.mamba_pool_idx == 0
    before = session_state(engine, "idle")
    for sid in ("x", "y", "z"):
        engine.open_session(sid)
    run_batch(engine, {sid: (token_ids(9, i), greedy(12)) for i, sid in enumerate("xyz")})
    assert_same_state(session_state(engine, "idle"), before, exact=True)
    close_and_check(engine)
