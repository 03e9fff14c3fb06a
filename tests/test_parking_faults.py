"""A park, restore or swap that fails part-way leaves every session where it was.

Each case injects one fault (``park_copy_fails:N``, ``park_host_alloc_fails``: the N-th state
copy, or the next host allocation, of parking raises) into a turn that needs GPU room made for it,
on a strict engine whose GPU and host tiers are both full, so the turn's session is restored
through a swap (three copies and one host allocation) or, with host room, a park then a restore.
Then: the turn fails with INTERNAL and a message (the engine lives on), every session's state is
bit for bit what it was and where it was, nothing is leaked, and the same turn run again gives
exactly the tokens a fault-free engine gives for the same history.
"""

from __future__ import annotations

import pytest

from replica.api import StatusCode
from replica.config import PoolConfig
from replica.engine.engine import Engine
from tests.support.engine import (
    assert_same_state,
    close_and_check,
    greedy,
    make_engine,
    run_turn,
    session_state,
)

SESSIONS = "abcd"
# the history parks two sessions on its way (opening c and d): one copy and one host allocation
# each, before the turn under test
HISTORY_OPS = 2


def after_history(failpoint: str) -> frozenset[str]:
    """``failpoint`` counted from the turn under test on."""
    name, _, n = failpoint.partition(":")
    return frozenset({f"{name}:{int(n or 1) + HISTORY_OPS}"})


def engine_with(failpoints: frozenset[str], host_room: bool) -> Engine:
    pools = PoolConfig(
        max_sessions=2,
        max_parked_sessions=3 if host_room else 2,
        kv_tokens=256,
        max_context=128,
        page_size=16,
    )
    return make_engine(pools, failpoints=failpoints)


def history(engine: Engine) -> None:
    """Four sessions with a turn each: two end up parked (GPU full), the host full or not."""
    for i, sid in enumerate(SESSIONS):
        engine.open_session(sid)
        run_turn(engine, sid, [10 + i] * (17 + i), greedy(3))


def failed_turn(engine: Engine, sid: str) -> tuple[StatusCode, str]:
    req = engine.submit(sid, [7, 8, 9], greedy(4))
    for _ in range(1000):
        for event in engine.step():
            if event.turn_id == req.rid and (event.error_code or event.finished):
                assert event.error_code is not None, "the turn ran despite the fault"
                return event.error_code, event.error
    raise AssertionError("the turn neither failed nor finished")


CASES = [
    # (failpoint, host has room for the victims without the swap)
    ("park_copy_fails:1", False),  # swap: GPU -> transient copy of the victims
    ("park_copy_fails:2", False),  # swap: the restore's host -> GPU copy
    ("park_copy_fails:3", False),  # swap: transient -> host copy of the victims
    ("park_host_alloc_fails", False),  # swap: host slots for the victims
    ("park_copy_fails:1", True),  # park the victims
    ("park_host_alloc_fails", True),  # host slots for the victims
]


@pytest.mark.parametrize(("failpoint", "host_room"), CASES)
def test_a_fault_while_making_room_fails_only_that_turn(failpoint, host_room):
    faulty = engine_with(after_history(failpoint), host_room)
    reference = engine_with(frozenset(), host_room)
    history(faulty)
    history(reference)
    parked = set(faulty.sessions.residency.parked)
    assert parked == set(reference.sessions.residency.parked) and "a" in parked
    before = {sid: session_state(faulty, sid) for sid in SESSIONS}

    code, message = failed_turn(faulty, "a")
    assert code == StatusCode.INTERNAL
    assert "could not make room" in message and "retry the turn" in message
    assert set(faulty.sessions.residency.parked) == parked
    for sid in SESSIONS:
        assert_same_state(session_state(faulty, sid), before[sid], exact=True)
    assert faulty.check_invariant().leaked == 0

    # the failpoint fired once: the same turn now runs, exactly as without the fault
    assert run_turn(faulty, "a", [7, 8, 9], greedy(4)) == run_turn(
        reference, "a", [7, 8, 9], greedy(4)
    )
    for sid in "bcd":
        assert run_turn(faulty, sid, [1, 2], greedy(2)) == run_turn(
            reference, sid, [1, 2], greedy(2)
        )
    close_and_check(faulty)
    close_and_check(reference)


def test_a_fault_after_the_victims_parked_leaves_them_parked_and_the_turn_failed():
    """With host room, the park completes before the restore's copy fails: the victims are
    parked (one place: the host), the turn's session stays parked, nothing is lost."""
    faulty = engine_with(after_history("park_copy_fails:2"), host_room=True)
    history(faulty)
    before = {sid: session_state(faulty, sid) for sid in SESSIONS}
    code, _ = failed_turn(faulty, "a")
    assert code == StatusCode.INTERNAL
    assert "a" in faulty.sessions.residency.parked
    for sid in SESSIONS:
        assert_same_state(session_state(faulty, sid), before[sid], exact=True)
    assert faulty.check_invariant().leaked == 0
    run_turn(faulty, "a", [7, 8, 9], greedy(4))
    close_and_check(faulty)
