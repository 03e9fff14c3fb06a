"""Releasing forked sessions in every order gives every page back, and never one that a living
session still holds: after each release a new session's turn takes the free pages (so a page
freed too early is overwritten), and the survivors' state is still bit-identical. Refused forks
take nothing. Strict accounting (with each page's reference count checked against its holders)
after every step."""

from __future__ import annotations

import itertools

import pytest

from replica.api import (
    InvalidRequestError,
    PoolExhaustedError,
    ReplicaDrainingError,
    SessionNotFoundError,
    TurnRunningError,
)
from replica.config import PoolConfig
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    greedy,
    make_engine,
    run_turn,
    session_state,
    token_ids,
)

FAMILY = ("p", "c1", "c2", "g")  # g is a fork of c1


def family(page_size: int):
    eng = make_engine(
        # no cached states: the test counts the pages forks share
        PoolConfig(
            max_sessions=6,
            kv_tokens=512,
            max_context=128,
            page_size=page_size,
            max_cached_states=0,
        )
    )
    eng.open_session("p")
    run_turn(eng, "p", token_ids(37, 1), greedy(4))
    eng.fork_session("p", "c1")
    eng.fork_session("p", "c2")
    run_turn(eng, "c1", token_ids(19, 2), greedy(3))
    eng.fork_session("c1", "g")
    eng.check_invariant()
    return eng


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("order", list(itertools.permutations(FAMILY)), ids="-".join)
def test_release_in_any_order_frees_every_page(page_size, order):
    eng = family(page_size)
    states = {sid: session_state(eng, sid) for sid in FAMILY}
    for i, sid in enumerate(order):
        assert eng.close_session(sid)
        eng.check_invariant()
        eng.open_session(f"filler{i}")  # takes pages: a page freed too early is overwritten
        run_turn(eng, f"filler{i}", token_ids(60, 10 + i), greedy(0))
        for survivor in order[i + 1 :]:
            assert_same_state(session_state(eng, survivor), states[survivor], exact=True)
        assert eng.close_session(f"filler{i}")
        eng.check_invariant()
    assert eng.pool.kv_pool.page_allocator.shared_refs == 0
    close_and_check(eng)


def test_refused_forks_take_nothing():
    sizes = PoolConfig(
        max_sessions=2, kv_tokens=256, max_context=128, page_size=16, max_cached_states=0
    )  # no cached states: a refused fork must leave every count as it was
    eng = make_engine(sizes)
    eng.open_session("p")
    run_turn(eng, "p", token_ids(20, 3), greedy(2))
    before = eng.check_invariant().pools
    with pytest.raises(SessionNotFoundError):
        eng.fork_session("nobody", "c")
    with pytest.raises(InvalidRequestError):
        eng.fork_session("p", "p")
    eng.open_session("other")
    full = eng.check_invariant().pools
    with pytest.raises(PoolExhaustedError):  # no row left, and no host tier to park in
        eng.fork_session("p", "c")
    assert eng.check_invariant().pools == full
    eng.close_session("other")
    assert eng.check_invariant().pools == before
    eng.session_ops.draining = True
    with pytest.raises(ReplicaDrainingError):
        eng.fork_session("p", "c")
    eng.session_ops.draining = False
    assert eng.check_invariant().pools == before
    close_and_check(eng)


def test_fork_during_a_turn_without_a_checkpoint_is_refused():
    """Without a track buffer nothing holds the committed recurrent state during a turn."""
    eng = make_engine(
        PoolConfig(max_sessions=3, kv_tokens=256, max_context=128, mamba_track_buffers=0)
    )
    eng.open_session("p")
    run_turn(eng, "p", token_ids(10, 4), greedy(2))
    eng.submit("p", token_ids(5, 5), greedy(30))
    eng.step()
    before = eng.check_invariant().pools
    with pytest.raises(TurnRunningError):
        eng.fork_session("p", "c")
    assert eng.check_invariant().pools == before
    close_and_check(eng)
