import pytest

from replica.api import (
    InvalidRequestError,
    PoolExhaustedError,
    SessionNotFoundError,
    SlotStateError,
    TurnRunningError,
)
from replica.sessions.request import Req
from tests.support.pools import assert_all_free, assert_consistent, grow, make_pools


def test_restoring_a_closed_session_raises_not_found():
    pool, sessions, _ = make_pools()
    sessions.open("a")
    assert sessions.release_session("a") is True
    assert sessions.release_session("a") is False  # idempotent
    with pytest.raises(SessionNotFoundError, match="open a new session"):
        sessions.restore_to_req(Req("a", [1]))
    assert_all_free(pool, sessions)


def test_second_turn_while_one_runs_is_refused():
    pool, sessions, _ = make_pools()
    sessions.open("a")
    first = Req("a", [1])
    sessions.restore_to_req(first)
    with pytest.raises(TurnRunningError):
        sessions.restore_to_req(Req("a", [2]))
    sessions.save_from_req(first)
    sessions.release_session("a")
    assert_all_free(pool, sessions)


def test_open_twice_and_open_when_full():
    pool, sessions, _ = make_pools(max_sessions=2, track=2)
    sessions.open("a")
    with pytest.raises(InvalidRequestError):
        sessions.open("a")
    sessions.open("b")
    with pytest.raises(PoolExhaustedError, match="replica is full"):
        sessions.open("c")
    assert_consistent(pool, sessions)
    for sid in ("a", "b"):
        sessions.release_session(sid)
    assert_all_free(pool, sessions)


def test_freeing_a_released_sessions_slots_again_raises():
    pool, sessions, _ = make_pools(track=2)
    slot = sessions.open("a")
    sessions.release_session("a")
    with pytest.raises(SlotStateError, match="double free"):
        pool.free_mamba(slot.seq)
    with pytest.raises(SlotStateError):
        pool.free_rows(slot.req_pool_idx)
    assert_all_free(pool, sessions)


def test_close_during_turn_is_deferred_to_the_turns_end():
    pool, sessions, _ = make_pools(page_size=16, track=1)
    sessions.open("a")
    req = Req("a", [1] * 20)
    sessions.restore_to_req(req)
    grow(pool, req, 20)
    assert sessions.release_session("a") is True
    assert "a" in sessions.sessions  # still owns slots through the running turn
    with pytest.raises(SessionNotFoundError):
        sessions.get("a")
    assert_consistent(pool, sessions, [req])
    sessions.rollback(req)
    assert "a" not in sessions.sessions
    assert sessions.released_total["closed"] == 1
    assert_all_free(pool, sessions)


def test_rollback_without_track_buffer_commits_what_was_folded():
    pool, sessions, _ = make_pools(track=0)
    sessions.open("a")
    req = Req("a", [1] * 10)
    sessions.restore_to_req(req)
    grow(pool, req, 6)
    slot = sessions.rollback(req)
    assert slot.committed_len == 6
    assert slot.pending_ids == (1, 1, 1, 1)
    assert slot.committed_tokens == 10
    sessions.release_session("a")
    assert_all_free(pool, sessions)


def test_rollback_with_track_buffer_restores_turn_snapshot_and_frees_kv_tail():
    pool, sessions, _ = make_pools(page_size=16, track=1)
    sessions.open("a")
    turn1 = Req("a", [1] * 5)
    sessions.restore_to_req(turn1)
    grow(pool, turn1, 5)
    pool.mamba_pool.ssm[0][turn1.seq.mamba_pool_idx].fill_(1.5)
    sessions.save_from_req(turn1)
    free_after_turn1 = pool.kv_pool.free_tokens
    turn2 = Req("a", [2] * 30)
    sessions.restore_to_req(turn2)
    grow(pool, turn2, 30)
    mamba_idx = turn2.seq.mamba_pool_idx
    pool.mamba_pool.ssm[0][mamba_idx].fill_(9.0)
    slot = sessions.rollback(turn2)
    assert slot.committed_len == 5
    assert float(pool.mamba_pool.ssm[0][mamba_idx].max()) == 1.5
    assert pool.kv_pool.free_tokens == free_after_turn1
    sessions.release_session("a")
    assert_all_free(pool, sessions)


def release_expired(sessions) -> list[str]:
    expired = sessions.idle_expired()
    for sid in expired:
        sessions.release_session(sid, "idle_timeout")
    return expired


def test_idle_timeout_releases_only_idle_sessions():
    pool, sessions, clock = make_pools(idle_timeout_s=10)
    sessions.open("idle")
    sessions.open("busy")
    sessions.open("custom", idle_timeout_s=100)
    req = Req("busy", [1])
    sessions.restore_to_req(req)
    clock.now += 11
    assert release_expired(sessions) == ["idle"]
    assert sessions.released_total["idle_timeout"] == 1
    sessions.save_from_req(req)
    clock.now += 11
    assert release_expired(sessions) == ["busy"]
    clock.now += 100
    assert release_expired(sessions) == ["custom"]
    assert_all_free(pool, sessions)
