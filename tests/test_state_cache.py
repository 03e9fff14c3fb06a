"""The cache of states at turn boundaries: a session opened with a prefix starts from the longest
cached state that begins it and prefills only the rest, and continues exactly as transformers'
``generate`` and a cold session do over the same tokens; a full replica evicts cached states for
every open and turn (never refusing, never parking for them); bad prefixes are refused with
nothing taken. Strict accounting throughout; every slot back at the end."""

from __future__ import annotations

import pytest

from replica.api import ContextOverflowError, InvalidRequestError, ReleaseReason
from replica.config import PoolConfig
from tests.support.engine import (
    close_and_check,
    greedy,
    make_checkpoint_engine,
    make_engine,
    run_turn,
    token_ids,
)
from tests.support.hf_peer import hf_greedy, saved_peer


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return saved_peer(tmp_path_factory, seed=12)


@pytest.mark.parametrize("page_size", [1, 16], ids=["page1", "page16"])
def test_a_2000_token_prefix_is_prefilled_once(peer, page_size):
    hf, path = peer
    pools = PoolConfig(max_sessions=4, kv_tokens=10240, max_context=2304, page_size=page_size)
    engine = make_checkpoint_engine(path, pools, max_prefill_chunk=512)
    prefix = token_ids(2000, 21)
    engine.open_session("first")
    out1, _, _ = run_turn(engine, "first", prefix, greedy(4))  # caches 2000 and 2003 tokens
    engine.close_session("first")  # its pages stay with the cached states
    engine.check_invariant()
    assert engine.snapshot().state_cache.cached_states == 2

    before = engine.runner.prefilled_tokens
    info = engine.open_session("second", prefix_ids=[*prefix, 7])
    assert (info.cached_tokens, info.committed_tokens) == (2000, 2001)
    out2, _, _ = run_turn(engine, "second", [9], greedy(8))
    assert engine.runner.prefilled_tokens - before == 2  # the pending 7 and the input 9
    assert out2 == hf_greedy(hf, [*prefix, 7, 9], 8)

    # the turn-end state: 2003 tokens, a partial last page at page 16
    info = engine.open_session("third", prefix_ids=[*prefix, *out1])
    assert (info.cached_tokens, info.committed_tokens) == (2003, 2004)
    out3, _, _ = run_turn(engine, "third", [5], greedy(6))
    assert out3 == hf_greedy(hf, [*prefix, *out1, 5], 6)

    engine.open_session("cold")
    before = engine.runner.prefilled_tokens
    cold, _, _ = run_turn(engine, "cold", [*prefix, 7, 9], greedy(8))
    assert engine.runner.prefilled_tokens - before == 2002
    assert cold == out2
    stats = engine.snapshot().state_cache
    assert (stats.hits_total, stats.reused_tokens_total) == (2, 4003)
    assert stats.block_hashes and stats.block_tokens % page_size == 0
    close_and_check(engine)


def test_a_prefix_with_no_cached_state_starts_cold():
    engine = make_engine(PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256))
    info = engine.open_session("s", prefix_ids=[1, 2, 3])
    assert (info.cached_tokens, info.committed_tokens) == (0, 3)
    engine.open_session("cold")
    got, _, _ = run_turn(engine, "s", [4], greedy(5))
    assert got == run_turn(engine, "cold", [1, 2, 3, 4], greedy(5))[0]
    assert engine.snapshot().state_cache.misses_total == 1
    close_and_check(engine)


def test_bad_prefixes_are_refused_with_nothing_taken():
    engine = make_engine(PoolConfig(max_sessions=2, kv_tokens=512, max_context=64))
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        engine.open_session("s", prefix_ids=[1, 10**6])
    with pytest.raises(ContextOverflowError, match="more than the context"):
        engine.open_session("s", prefix_ids=[1] * 65)
    assert len(engine.sessions) == 0
    close_and_check(engine)


@pytest.mark.parametrize("parked", [0, 2], ids=["no-parking", "parking"])
def test_a_full_replica_evicts_cached_states_for_every_open_and_turn(parked):
    """Two session slots and a KV pool that two sessions fill: cached states take the room
    sessions leave, and every open and turn that needs it gets it back at once."""
    pools = PoolConfig(
        max_sessions=2,
        kv_tokens=256,
        max_context=128,
        page_size=16,
        max_parked_sessions=parked,
        host_kv_tokens=256 if parked else 0,
    )
    engine = make_engine(pools)
    a, b = token_ids(50, 1), token_ids(60, 2)
    engine.open_session("a")
    run_turn(engine, "a", a, greedy(5))
    assert engine.snapshot().pool("mamba").cached == 2  # every free mamba slot holds a state
    engine.open_session("b")  # needs those slots: evicted
    engine.check_invariant()
    for turn in range(2):  # each turn needs the KV the cache took after the last
        run_turn(engine, "a", token_ids(20, 3 + turn), greedy(10))
        run_turn(engine, "b", b if turn == 0 else token_ids(20, 5), greedy(10))
        engine.check_invariant()
    engine.close_session("a", ReleaseReason.CLOSED)
    info = engine.open_session("c", prefix_ids=[*a, 1])
    assert info.committed_tokens == 51
    run_turn(engine, "c", [2], greedy(3))
    snap = engine.check_invariant()
    assert snap.state_cache.evictions_total > 0
    assert snap.parking.parks_total == 0  # room came from the cache, never from parking
    close_and_check(engine)
