"""A turn submitted with a fork of its session, in one engine command (``submit_batch`` with a
fork's ``(child_id, lease_s)``, what a Realtime response does for its rollback point): the fork
is bit for bit the session's state before the turn and continues as the session would have; a
refused turn releases the fork it made; a fork with no room is no reason to refuse the turn,
which runs without one. Strict accounting after each, every slot back at the end."""

from __future__ import annotations

from replica.actor.batch_calls import submit_batch
from replica.api import ForkedTurn, SessionInfo, StatusCode
from replica.config import PoolConfig
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    drain,
    greedy,
    make_engine,
    run_turn,
    session_state,
    token_ids,
)

GATEWAY = "gw-test"


def engine(max_sessions: int = 4):
    return make_engine(
        # no cached states: the tests compare every pool count before and after
        PoolConfig(
            max_sessions=max_sessions, kv_tokens=1024, max_context=256, page_size=16,
            max_cached_states=0,
        )
    )  # fmt: skip


def outputs(events, turn_id: int) -> list[int]:
    return [t for e in events if e.turn_id == turn_id for t in e.token_ids]


def test_the_fork_is_the_state_before_the_turn():
    eng = engine()
    eng.open_session("p", tenant="t1")
    run_turn(eng, "p", token_ids(29, 1), greedy(6))
    before, committed = session_state(eng, "p"), eng.session_info("p").committed_tokens
    b = token_ids(7, 2)
    [result] = submit_batch(eng, GATEWAY, [("p", b, greedy(9), ("c", 15.0))])
    assert isinstance(result, ForkedTurn) and isinstance(result.fork, SessionInfo)
    assert result.fork.session_id == "c"
    assert result.fork.committed_tokens == committed
    slot = eng.sessions.get("c")
    assert (slot.tenant, slot.gateway_id) == ("t1", GATEWAY)
    assert eng.leases.held("c")  # held by the stream from the start, as an open's lease
    eng.check_invariant()
    events = drain(eng)
    parent_out = outputs(events, result.turn_id)
    assert len(parent_out) == 9
    assert_same_state(session_state(eng, "c"), before, exact=True)
    # the same turn on the fork: the same tokens (an exact rollback point)
    assert run_turn(eng, "c", b, greedy(9))[0] == parent_out
    eng.check_invariant()
    close_and_check(eng)


def test_a_refused_turn_releases_the_fork_it_made():
    eng = engine()
    eng.open_session("p")
    run_turn(eng, "p", token_ids(20, 3), greedy(2))
    before = eng.check_invariant().pools
    vocab = eng.model_config.vocab_size
    [bad] = submit_batch(eng, GATEWAY, [("p", [vocab + 5], greedy(4), ("c", 15.0))])
    assert bad.code == StatusCode.INVALID_ARGUMENT, bad
    assert "c" not in eng.sessions.sessions
    assert eng.check_invariant().pools == before
    # a turn already running: the second one is refused, and so leaves no fork either
    eng.submit("p", token_ids(5, 4), greedy(30))
    eng.step()
    [busy] = submit_batch(eng, GATEWAY, [("p", token_ids(3, 5), greedy(4), ("c", 15.0))])
    assert busy.code == StatusCode.FAILED_PRECONDITION, busy
    assert "c" not in eng.sessions.sessions
    assert eng.check_invariant().open_sessions == 1  # the parent's own pages grow with its turn
    drain(eng)
    close_and_check(eng)


def test_no_room_for_the_fork_the_turn_runs_without_one():
    eng = engine(max_sessions=2)
    eng.open_session("p")
    run_turn(eng, "p", token_ids(20, 6), greedy(2))
    eng.open_session("other")  # every row taken, and no host tier to park in
    full = eng.check_invariant().pools
    [result] = submit_batch(eng, GATEWAY, [("p", token_ids(4, 7), greedy(5), ("c", 15.0))])
    assert isinstance(result, ForkedTurn)
    assert result.fork.code == StatusCode.RESOURCE_EXHAUSTED, result.fork
    assert "c" not in eng.sessions.sessions
    events = drain(eng)
    assert len(outputs(events, result.turn_id)) == 5
    assert [e.finished for e in events if e.turn_id == result.turn_id][-1]
    assert eng.check_invariant().pools == full
    close_and_check(eng)


def test_turns_with_and_without_forks_in_one_batch():
    eng = engine()
    for sid in ("a", "b"):
        eng.open_session(sid)
        run_turn(eng, sid, token_ids(12, 8), greedy(2))
    results = submit_batch(
        eng,
        GATEWAY,
        [("a", token_ids(3, 9), greedy(3)), ("b", token_ids(3, 9), greedy(3), ("b-fork", 0.0))],
    )
    assert isinstance(results[0], int) and isinstance(results[1], ForkedTurn)
    assert not eng.leases.held("b-fork")  # lease_s 0: none
    drain(eng)
    assert eng.close_session("b-fork")
    eng.check_invariant()
    close_and_check(eng)


def test_the_fork_takes_the_room_of_the_one_it_replaces():
    """At capacity: the previous rollback point is released first, in the same command, and
    the new fork takes its room; one that is not open here is left to its caller."""
    eng = engine(max_sessions=2)
    eng.open_session("p")
    run_turn(eng, "p", token_ids(20, 10), greedy(2))
    eng.fork_session("p", "c0")  # the previous rollback point: the replica is full
    eng.check_invariant()
    [result] = submit_batch(eng, GATEWAY, [("p", token_ids(4, 11), greedy(3), ("c1", 15.0, "c0"))])
    assert isinstance(result, ForkedTurn) and result.replaced
    assert isinstance(result.fork, SessionInfo) and result.fork.session_id == "c1"
    assert "c0" not in eng.sessions.sessions
    drain(eng)
    eng.check_invariant()
    [again] = submit_batch(eng, GATEWAY, [("p", token_ids(3, 12), greedy(2), ("c2", 0.0, "gone"))])
    assert not again.replaced and again.fork.code == StatusCode.RESOURCE_EXHAUSTED
    drain(eng)
    assert eng.close_session("c1")
    assert eng.check_invariant().open_sessions == 1
    close_and_check(eng)
