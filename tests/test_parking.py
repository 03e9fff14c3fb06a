"""Parking at the session layer, scenario by scenario (real pools and copies, a fake clock), and
the settings that turn it on.

Each scenario checks the accounting invariant (GPU and host pools, 0 leaked) after every step
and that every idle session's state, read from wherever it lives, is bit for bit what it was.
"""

from __future__ import annotations

import pytest
import torch

from replica.accounting import LeakError
from replica.api import PoolExhaustedError, ReleaseReason
from replica.config import PoolConfig
from replica.sessions.request import Req
from replica.sessions.table import StateLocation
from tests.support.engine import close_and_check, greedy, make_engine
from tests.support.engine import run_turn as run_engine_turn
from tests.support.pools import (
    STATE_MODELS,
    assert_all_free,
    assert_consistent,
    grow,
    make_pools,
    read_state,
)


def parking(max_sessions=2, max_parked=3, page_size=16, **kw):
    return make_pools(
        max_sessions=max_sessions,
        max_parked=max_parked,
        kv_tokens=256,
        page_size=page_size,
        max_context=128,
        **kw,
    )


def run_turn(pool, sessions, sid: str, n: int, seed: int) -> Req:
    """A committed turn folding ``n`` tokens; its state is random (seeded)."""
    req = Req(sid, [5] * n)
    slot = sessions.get(sid)
    assert sessions.residency.room_for_turn(slot, slot.committed_len + n)
    sessions.restore_to_req(req)
    grow(pool, req, n)
    fill_random(pool, req, seed)
    sessions.save_from_req(req)
    return req


def fill_random(pool, req: Req, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    mamba, kv, idx = pool.mamba_pool, pool.kv_pool, req.seq.mamba_pool_idx
    for t in (mamba.conv_all, mamba.ssm_all):
        t[:, idx] = torch.randn(t[:, idx].shape, generator=gen)
    slots = pool.req_to_token[req.seq.req_pool_idx, : req.folded_len].long()
    for t in (kv.k_all, kv.v_all):
        t[:, slots] = torch.randn(t[:, slots].shape, generator=gen)


def assert_states(sessions, want: dict[str, dict]) -> None:
    for sid, state in want.items():
        got = read_state(sessions, sid)
        for name in state:
            assert torch.equal(got[name], state[name]), (sid, name)


def test_open_beyond_the_gpu_parks_the_least_recently_used_idle_session():
    pool, sessions, clock = parking()
    for i, sid in enumerate(("a", "b")):
        sessions.open(sid)
        run_turn(pool, sessions, sid, 20 + i, seed=i)
        clock.now += 1
    run_turn(pool, sessions, "a", 3, seed=9)  # a is now the most recently active
    want = {sid: read_state(sessions, sid) for sid in ("a", "b")}
    sessions.open("c")
    assert sessions.get("b").location is StateLocation.HOST
    assert {s: sessions.get(s).parked for s in "abc"} == {"a": False, "b": True, "c": False}
    snap = assert_consistent(pool, sessions)
    assert snap.pool("host_mamba").session_held == 1
    assert snap.pool("host_kv_tokens").session_held == 32  # 20 tokens: 2 pages of 16
    assert snap.pool("req").session_held == 2
    assert_states(sessions, want)
    # b's next turn restores it (parking a, now the least recently used) and continues
    run_turn(pool, sessions, "b", 4, seed=10)
    assert sessions.get("a").parked and not sessions.get("b").parked
    assert_states(sessions, {"a": want["a"]})
    assert sessions.residency.parker.parks_total == 2
    assert sessions.residency.parker.restores_total == 1
    for sid in "abc":
        sessions.release_session(sid)
    assert_all_free(pool, sessions)


def test_a_turn_that_needs_kv_room_parks_the_least_recently_used_idle_session():
    """GPU rows to spare, KV pages not: a resident session's longer turn parks idle sessions,
    least recently active first, until its KV fits, and leaves the others alone."""
    pool, sessions, clock = make_pools(
        max_sessions=3, max_parked=2, kv_tokens=64, page_size=16, max_context=64
    )
    for i, sid in enumerate(("a", "b", "c")):
        sessions.open(sid)
        run_turn(pool, sessions, sid, 16, seed=i)  # one page each; a is the least recent
        clock.now += 1
    want = {sid: read_state(sessions, sid) for sid in ("a", "b")}
    slot = sessions.get("c")
    assert sessions.residency.room_for_turn(slot, 48)  # 2 more pages: 1 free, a parked
    assert {s: sessions.get(s).parked for s in "abc"} == {"a": True, "b": False, "c": False}
    assert_consistent(pool, sessions)
    assert_states(sessions, want)
    assert not sessions.residency.room_for_turn(slot, 80)  # past the whole pool: nothing moves
    assert {s: sessions.get(s).parked for s in "abc"} == {"a": True, "b": False, "c": False}
    for sid in "abc":
        sessions.release_session(sid)
    assert_all_free(pool, sessions)


def test_a_new_session_starts_parked_when_every_gpu_slot_runs_a_turn():
    pool, sessions, _ = parking(max_sessions=1)
    sessions.open("a")
    run_turn(pool, sessions, "a", 10, seed=1)
    sessions.open("b")  # parks a
    run_turn(pool, sessions, "b", 10, seed=2)
    run_turn(pool, sessions, "a", 2, seed=3)  # restores a, parks b
    sessions.release_session("b")  # its host slot is free again, still holding b's bytes
    busy = Req("a", [1, 2])
    slot = sessions.get("a")
    assert sessions.residency.room_for_turn(slot, slot.committed_len + 2)
    sessions.restore_to_req(busy)
    sessions.open("c")  # the only GPU slot runs a's turn: c is born parked, in b's old slot
    assert sessions.get("c").parked
    state = read_state(sessions, "c")
    assert all(torch.count_nonzero(state[k]) == 0 for k in ("conv", "ssm"))
    assert state["k"].numel() == 0
    assert_consistent(pool, sessions, [busy])
    sessions.save_from_req(busy)
    for sid in "ac":
        sessions.release_session(sid)
    assert_all_free(pool, sessions)


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
@pytest.mark.parametrize("page_size", [1, 16])
def test_a_turn_swaps_through_a_full_host_tier(page_size, state):
    """GPU and host both full, every resident session idle: a parked session's turn still runs
    (the LRU resident one goes to the host slots the restored one leaves). Both shapes of
    recurrent state (Mamba2, gated DeltaNet) move bit for bit."""
    pool, sessions, clock = parking(
        max_sessions=2, max_parked=2, page_size=page_size, model=STATE_MODELS[state]
    )
    for i, sid in enumerate("abcd"):
        sessions.open(sid)
        run_turn(pool, sessions, sid, 17 + i, seed=i)
        clock.now += 1
    assert set(sessions.parked) == {"a", "b"}
    with pytest.raises(PoolExhaustedError, match="replica is full"):
        sessions.open("e")  # host full too: refused, nothing taken
    want = {sid: read_state(sessions, sid) for sid in "abcd"}
    run_turn(pool, sessions, "a", 5, seed=7)
    assert set(sessions.parked) == {"b", "c"}
    assert_states(sessions, {s: want[s] for s in "bcd"})
    snap = assert_consistent(pool, sessions)
    assert snap.pool("host_mamba").free == 0
    for sid in "abcd":
        sessions.release_session(sid)
    assert_all_free(pool, sessions)


def test_close_and_idle_timeout_free_a_parked_sessions_host_slots():
    pool, sessions, clock = parking(idle_timeout_s=30.0)
    for i, sid in enumerate("abc"):
        sessions.open(sid, idle_timeout_s=10.0 if sid == "b" else None)
        run_turn(pool, sessions, sid, 40, seed=i)
    assert set(sessions.parked) == {"a"}
    assert sessions.residency.park_idle(0.0) == 2  # b and c too, in one batch
    assert set(sessions.parked) == {"a", "b", "c"}
    assert sessions.release_session("a", ReleaseReason.CLOSED)
    assert not sessions.release_session("a")
    clock.now += 11
    assert sessions.idle_expired() == ["b"]
    sessions.release_session("b", ReleaseReason.IDLE_TIMEOUT)
    snap = assert_consistent(pool, sessions)
    assert snap.pool("host_mamba").session_held == 1
    assert snap.pool("host_kv_tokens").session_held == 48
    assert dict(sessions.released_total) == {"closed": 1, "idle_timeout": 1}
    sessions.release_session("c")
    assert_all_free(pool, sessions)


def test_parking_during_another_sessions_turn_leaves_that_turn_alone():
    pool, sessions, clock = parking()
    for i, sid in enumerate("ab"):
        sessions.open(sid)
        run_turn(pool, sessions, sid, 12, seed=i)
    running = Req("a", [3] * 8)
    slot = sessions.get("a")
    assert sessions.residency.room_for_turn(slot, slot.committed_len + 8)
    sessions.restore_to_req(running)
    grow(pool, running, 4)
    fill_random(pool, running, seed=5)
    before = read_state_of_turn(pool, running)
    sessions.open("c")  # parks b, the only idle resident session; a's turn is untouched
    assert sessions.get("b").parked and not sessions.get("a").parked
    assert_consistent(pool, sessions, [running])
    assert all(torch.equal(x, y) for x, y in zip(read_state_of_turn(pool, running), before))
    sessions.save_from_req(running)
    for sid in "abc":
        sessions.release_session(sid)
    assert_all_free(pool, sessions)


def read_state_of_turn(pool, req: Req) -> tuple[torch.Tensor, ...]:
    slots = pool.req_to_token[req.seq.req_pool_idx, : req.folded_len].long()
    idx = req.seq.mamba_pool_idx
    mamba, kv = pool.mamba_pool, pool.kv_pool
    return tuple(t.clone() for t in (mamba.ssm_all[:, idx], kv.k_all[:, slots]))


def test_a_batch_of_sessions_parks_in_one_copy_per_state_kind():
    pool, sessions, _ = parking(max_sessions=4, max_parked=4)
    for i, sid in enumerate("abcd"):
        sessions.open(sid)
        run_turn(pool, sessions, sid, 5 + 9 * i, seed=i)
    copier = sessions.residency.parker.copier
    calls = []
    original = copier.copy
    copier.copy = lambda *args: calls.append(args[1].numel()) or original(*args)
    assert sessions.residency.park_idle(0.0) == 4
    assert len(calls) == 4  # conv, ssm, k, v: all layers, all four sessions in each
    assert calls[:2] == [4, 4]
    assert calls[2] == calls[3] == 1 + 1 + 2 + 2  # pages of 5, 14, 23 and 32 tokens
    assert_consistent(pool, sessions)


def test_a_host_slot_nobody_owns_shows_up_as_leaked():
    """The detector: the host pools' session_held comes from the parked sessions' records, so a
    host slot taken outside them is counted as leaked (strict mode raises)."""
    pool, sessions, _ = parking()
    sessions.residency.parker.host.alloc([2])
    with pytest.raises(LeakError, match="host_mamba: .* leaked=1; host_kv_tokens: .* leaked=32"):
        assert_consistent(pool, sessions)


def test_parking_settings_and_park_after_idle():
    """The flags: --max-parked-sessions sizes the host tier (host KV by default a GPU session's
    share per parked session); --park-after-idle-s needs it; the engine parks sessions idle
    that long when asked between steps (the engine thread asks about every second)."""
    from router.config import ServeConfig

    config = ServeConfig.from_flags(
        max_sessions=4, kv_tokens=1024, page_size=16, max_parked_sessions=10
    ).replica
    assert config.pools.host_kv_pages * 16 == 10 * 256 and config.park_after_idle_s == 0
    with pytest.raises(ValueError, match="--park-after-idle-s needs --max-parked-sessions"):
        ServeConfig.from_flags(park_after_idle_s=5.0)
    with pytest.raises(ValueError, match="max_parked_sessions must be >= 0"):
        ServeConfig.from_flags(max_parked_sessions=-1)

    pools = PoolConfig(max_sessions=4, kv_tokens=512, max_context=128, max_parked_sessions=4)
    for after, parked in ((3600.0, 0), (1e-9, 2)):
        engine = make_engine(pools, park_after_idle_s=after)
        for sid in "ab":
            engine.open_session(sid)
            run_engine_turn(engine, sid, [1, 2, 3], greedy(2))
        assert engine.session_ops.park_idle() == parked
        assert len(engine.sessions.parked) == parked
        assert [engine.session_info(s).parked for s in "ab"] == [bool(parked)] * 2
        close_and_check(engine)
