"""Regression: releasing a session must free its mamba slots (state + track buffer), and with
parking, every slot of the host tier too.

A replica sized for 4 sessions with 2 track buffers (12 mamba slots) runs 10,000 open / turn /
close cycles, for both shapes of recurrent state (Mamba2, gated DeltaNet). If a release leaked
the 3 mamba slots of a session, the pool would run dry after 4 cycles. ``session_held_mamba_slots``
must equal (idle sessions) x 3 exactly at every step, a session whose turn is in the running batch
excluded.
"""

import pytest

from replica.api import ReleaseReason
from replica.sessions.request import Req
from tests.support.pools import STATE_MODELS, assert_all_free, assert_consistent, grow, make_pools

CYCLES = 10_000


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
def test_ten_thousand_short_sessions_never_exhaust_the_mamba_pool(state):
    pool, sessions, clock = make_pools(
        max_sessions=4, kv_tokens=256, page_size=16, track=2, model=STATE_MODELS[state]
    )
    idle: list[str] = []
    for cycle in range(CYCLES):
        if len(idle) == 4:  # keep up to 3 sessions idle alongside the one cycling
            sessions.release_session(idle.pop(0))
        sid = f"c{cycle}"
        sessions.open(sid)
        assert sessions.session_held_mamba_slots(active=()) == (len(idle) + 1) * 3
        req = Req(sid, [1, 2, 3])
        sessions.restore_to_req(req)
        grow(pool, req, 3 + cycle % 5)
        active = {req.seq.req_pool_idx}
        assert sessions.session_held_mamba_slots(active) == len(idle) * 3
        if cycle % 100 == 0:
            assert_consistent(pool, sessions, [req])
        sessions.save_from_req(req)
        assert sessions.session_held_mamba_slots(active=()) == (len(idle) + 1) * 3
        if cycle % 3 == 0:
            sessions.release_session(sid)
        else:
            idle.append(sid)
        clock.now += 1.0
    for sid in idle:
        sessions.release_session(sid)
    assert sessions.opened_total == CYCLES
    assert sum(sessions.released_total.values()) == CYCLES
    assert_all_free(pool, sessions)


def test_ten_thousand_cycles_through_the_host_tier_never_run_out_of_any_slot():
    """Open / turn / idle / park / restore / close, 10,000 times, on a replica of 2 GPU sessions
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
