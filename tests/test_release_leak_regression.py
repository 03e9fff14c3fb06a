"""Regression: releasing a session must free its mamba slots (state + track buffer), and with
parking, every slot of the host tier too.

A replica sized for 4 sessions with 2 track buffers (12 mamba slots) runs 1,260 open / turn /
close cycles (10,000 under ``HYPOTHESIS_PROFILE=soak``), for both shapes of recurrent state
(Mamba2, gated DeltaNet). If a release leaked the 3 mamba slots of a session (the seed's bug), the
pool would run dry after 4 cycles; the cycles' patterns repeat every 15 cycles here and every 84
in the host-tier run, so each mix of them occurs 15 times or more. At every step the allocators'
free counts must be what the open sessions alone account for (3 mamba slots, a row and one KV
page each), counted by the test itself; every 100 cycles the whole snapshot is compared with that
count. With the seed's bug switched back on (failpoint ``leak_mamba_on_release``) the same run
must fail at the first release.
"""

import os

import pytest

from replica.api import ReleaseReason
from replica.model.config import ModelConfig
from replica.sessions.request import Req
from tests.support.pool_oracle import Capacity, check_pools
from tests.support.pools import (
    STATE_MODELS,
    TINY_MODEL,
    assert_all_free,
    assert_consistent,
    grow,
    make_pools,
    snapshot,
)

# Each leak these runs guard against runs a pool dry within a few cycles; the soak profile keeps
# the long run for the rare interleavings.
CYCLES = 10_000 if os.environ.get("HYPOTHESIS_PROFILE") == "soak" else 1_260
CAP = Capacity(max_sessions=4, track=2, kv_tokens=256, page_size=16)


def run_cycles(
    cycles: int, state_model: ModelConfig = TINY_MODEL, failpoints: frozenset[str] = frozenset()
) -> None:
    pool, sessions, clock = make_pools(
        max_sessions=CAP.max_sessions,
        kv_tokens=CAP.kv_tokens,
        page_size=CAP.page_size,
        track=CAP.track,
        failpoints=failpoints,
        model=state_model,
    )

    def check_free(open_sessions: int) -> None:
        free = CAP.max_sessions - open_sessions
        assert pool.mamba_pool.num_free == free * CAP.mamba_per_session, (
            f"mamba: {pool.mamba_pool.num_free} slots free with {open_sessions} sessions open; "
            f"want {free * CAP.mamba_per_session}"
        )
        assert pool.num_free == free, f"req: {pool.num_free} rows free, want {free}"
        # every session that ran its turn keeps one page (its turn folds fewer than 16 tokens)
        assert pool.kv_pool.free_tokens == (CAP.kv_pages - open_sessions) * CAP.page_size

    idle: list[str] = []
    for cycle in range(cycles):
        if len(idle) == CAP.max_sessions:  # keep up to 3 sessions idle alongside the one cycling
            sessions.release_session(idle.pop(0))
            check_free(len(idle))
        sid = f"c{cycle}"
        sessions.open(sid)
        req = Req(sid, [1, 2, 3])
        sessions.restore_to_req(req)
        grow(pool, req, 3 + cycle % 5)
        if cycle % 100 == 0:
            want = CAP.expect(idle=len(idle), running=1, idle_pages=len(idle), running_pages=1)
            check_pools(pool, snapshot(pool, sessions, [req]), want)
            assert_consistent(pool, sessions, [req])
        sessions.save_from_req(req)
        if cycle % 3 == 0:
            sessions.release_session(sid)
        else:
            idle.append(sid)
        check_free(len(idle))
        clock.now += 1.0
    for sid in idle:
        sessions.release_session(sid)
    assert sessions.opened_total == cycles
    assert sum(sessions.released_total.values()) == cycles
    assert_all_free(pool, sessions)


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
def test_many_short_sessions_never_exhaust_the_mamba_pool(state):
    run_cycles(CYCLES, STATE_MODELS[state])


def test_the_regression_fails_when_release_leaks_mamba_slots():
    with pytest.raises(AssertionError, match="mamba: 9 slots free with 0 sessions open"):
        run_cycles(CYCLES, failpoints=frozenset({"leak_mamba_on_release"}))


def test_cycles_through_the_host_tier_never_run_out_of_any_slot():
    """Open / turn / idle / park / restore / close, CYCLES times, on a replica of 2 GPU sessions
    and 4 parked ones that always keeps 3 other sessions open (so opens and restores park the
    least recently used one on demand). Sessions end every way a release happens: closed while
    resident, closed while parked, closed during a turn, timed out while parked. A leak of any
    slot, GPU or host, runs a pool dry within a few cycles."""
    pool, sessions, clock = make_pools(
        max_sessions=2, max_parked=4, kv_tokens=128, page_size=16, track=1, idle_timeout_s=5.0
    )
    residency = sessions.residency
    kept: list[str] = []

    def turn(sid: str, n: int, end: bool = True) -> Req:
        req = Req(sid, [1] * n)
        slot = sessions.get(sid)
        assert residency.room_for_turn(slot, slot.committed_len + n), sid
        sessions.restore_to_req(req)
        grow(pool, req, n)
        if end:
            sessions.save_from_req(req)
        return req

    for cycle in range(CYCLES):
        sid = f"c{cycle}"
        sessions.open(sid)
        turn(sid, 1 + cycle % 7)  # its first turn: the state it parks with
        clock.now += 1.0  # idle
        if cycle % 3 or len(kept) < 2:  # (a period prime to the endings': every mix occurs)
            residency.park_idle(0.5)  # parked because it idled
        for other in kept:  # else parked on demand: others' turns need its GPU slots
            if sessions.get(sid).parked:
                break
            turn(other, 1)
        assert sessions.get(sid).parked
        ending = cycle % 4
        if ending == 0:  # a turn restores it, then it is closed
            turn(sid, 3)
            sessions.release_session(sid)
        elif ending == 1:  # closed while parked
            sessions.release_session(sid)
        elif ending == 2:  # closed during its next turn
            req = turn(sid, 2, end=False)
            sessions.release_session(sid)
            sessions.rollback(req)
        else:  # kept; the oldest kept session times out
            kept.append(sid)
            if len(kept) > 3:
                clock.now += 5.0
                for expired in sessions.idle_expired():
                    sessions.release_session(expired, ReleaseReason.IDLE_TIMEOUT)
                    kept.remove(expired)
        if cycle % 100 == 0:
            assert_consistent(pool, sessions)
    for sid in kept:
        sessions.release_session(sid)
    parker = residency.parker
    assert sessions.opened_total == CYCLES
    assert sum(sessions.released_total.values()) == CYCLES
    assert parker.parks_total >= CYCLES and parker.restores_total >= CYCLES // 2
    assert_all_free(pool, sessions)
