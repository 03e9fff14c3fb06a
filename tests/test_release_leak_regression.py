"""Regression: releasing a session must free its mamba slots (state + track buffer).

A replica sized for 4 sessions with 2 track buffers (12 mamba slots) runs 10,000 open / turn /
close cycles, for both shapes of recurrent state (Mamba2, gated DeltaNet). If a release leaked
the 3 mamba slots of a session, the pool would run dry after 4 cycles. ``session_held_mamba_slots``
must equal (idle sessions) x 3 exactly at every step, a session whose turn is in the running batch
excluded.
"""

import pytest

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
