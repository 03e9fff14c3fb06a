"""Placement of an open with a prefix: the replica with room whose cached states hold the
longest block-aligned prefix of it wins; without any, the usual rule (most free room); a
replica without room is never chosen for its cache; cached slots count as room."""

from __future__ import annotations

import dataclasses

from replica.api import PoolStats, StateCacheStats
from replica.prefix_hashes import block_tokens, chained_block_hashes
from router.control.placement import cached_prefix_tokens, choose_replica
from tests.test_placement import make_view

BLOCK = block_tokens(16)  # 64 tokens
PROMPT = [(i * 37) % 300 for i in range(10 * BLOCK + 5)]


def caching(view, cached_ids: list[int]):
    """``view`` whose snapshot's cache holds a state of ``cached_ids``."""
    stats = StateCacheStats(1, 8, block_tokens=BLOCK)
    hashes = frozenset(chained_block_hashes(cached_ids, BLOCK))
    snap = dataclasses.replace(
        view.snapshot, state_cache=dataclasses.replace(stats, block_hashes=hashes)
    )
    return dataclasses.replace(view, snapshot=snap)


def test_the_longest_cached_prefix_wins_over_free_room():
    roomy = make_view("r0", free_mamba=16)
    short = caching(make_view("r1", free_mamba=4), PROMPT[: 3 * BLOCK + 7])
    long = caching(make_view("r2", free_mamba=2), PROMPT[: 7 * BLOCK])
    views = [roomy, short, long]
    assert cached_prefix_tokens(views, PROMPT) == {"r0": 0, "r1": 3 * BLOCK, "r2": 7 * BLOCK}
    assert choose_replica(views, prefix_ids=PROMPT) == "r2"
    assert choose_replica(views, prefix_ids=PROMPT[: 5 * BLOCK]) == "r2"  # 5 blocks of it
    assert choose_replica(views, prefix_ids=PROMPT[: 2 * BLOCK]) == "r1"  # a tie: more room
    assert choose_replica(views) == "r0"  # no prefix: most free room
    assert choose_replica(views, prefix_ids=PROMPT[: BLOCK - 1]) == "r0"  # no whole block


def test_a_different_prefix_or_a_full_replica_falls_back_to_room():
    full = caching(make_view("r1", free_mamba=0, free_req=0), PROMPT)
    other = make_view("r0", free_mamba=6)
    assert choose_replica([other, full], prefix_ids=PROMPT) == "r0"
    changed = [PROMPT[0] + 1, *PROMPT[1:]]
    holder = caching(make_view("r1", free_mamba=2), PROMPT)
    assert choose_replica([other, holder], prefix_ids=changed) == "r0"
    assert choose_replica([other, holder], prefix_ids=PROMPT) == "r1"


def test_cached_slots_count_as_room():
    view = make_view("r0", free_mamba=0)
    snap = view.snapshot
    pools = tuple(
        PoolStats("mamba", 16, 0, 0, 12, 4) if p.pool == "mamba" else p for p in snap.pools
    )
    roomy = dataclasses.replace(view, snapshot=dataclasses.replace(snap, pools=pools))
    assert roomy.free_mamba == 4 and choose_replica([roomy]) == "r0"
    assert choose_replica([view]) is None
