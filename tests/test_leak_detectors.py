"""The replica's leak detector, given the failure it exists to catch (failpoints that bring back
the seed's bug, or its twin for KV pages), as the engine really runs it.

Strict mode: the invariant check that runs when the engine goes idle raises ``LeakError`` naming
the replica, the pool and every count. Non-strict (production): the same line is logged at
ERROR, the violation is counted, the snapshot reports exactly the leaked slots, and the replica
keeps serving until the leak has eaten its pool.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from replica.accounting import LeakError
from replica.api import PoolExhaustedError
from replica.config import PoolConfig
from tests.support.engine import drain, greedy, make_engine, run_turn
from tests.support.pool_oracle import Capacity

CAP = Capacity(max_sessions=4, track=2, kv_tokens=256, page_size=16)
POOLS = PoolConfig(
    max_sessions=CAP.max_sessions,
    kv_tokens=CAP.kv_tokens,
    page_size=CAP.page_size,
    mamba_track_buffers=CAP.track,
    max_context=128,
    max_cached_states=0,  # the seed's bug exactly: nothing else holds a released session's slots
)
CACHING = dataclasses.replace(POOLS, max_cached_states=-1)
# a turn of 8 input and 4 new tokens commits 12 tokens, 11 of them folded in: one KV page
TURN_INPUT, TURN_NEW = list(range(1, 9)), 4
LONG_INPUT = list(range(1, 41))  # two whole pages: a state cached after it shares them


def leaking_engine(failpoint: str, strict: bool, pools: PoolConfig = POOLS):
    return make_engine(pools, strict=strict, failpoints=frozenset({failpoint}))


@pytest.mark.parametrize(
    ("failpoint", "line"),
    [
        (
            "leak_mamba_on_release",
            "mamba: capacity=12 free=6 in_use=0 session_held=3 cached=0 leaked=3",
        ),
        (
            "leak_kv_on_release",
            "kv_tokens: capacity=256 free=224 in_use=0 session_held=16 cached=0 leaked=16",
        ),
    ],
)
def test_strict_mode_raises_naming_the_pool_and_its_counts(failpoint, line):
    """Session a is closed while b's turn runs; the step that ends b's turn leaves the engine
    idle, and its invariant check raises."""
    engine = leaking_engine(failpoint, strict=True)
    engine.open_session("a")
    engine.open_session("b")
    run_turn(engine, "a", TURN_INPUT, greedy(TURN_NEW))
    engine.submit("b", TURN_INPUT, greedy(TURN_NEW))
    engine.step()
    assert engine.close_session("a")
    with pytest.raises(LeakError) as caught:
        drain(engine)
    message = str(caught.value)
    assert "pool accounting broken on replica replica-0" in message
    assert line in message, message


def test_non_strict_mode_logs_counts_and_keeps_serving_until_the_pool_is_gone(caplog):
    engine = leaking_engine("leak_mamba_on_release", strict=False)
    per = CAP.mamba_per_session
    for cycle in range(1, CAP.max_sessions + 1):
        sid = f"s{cycle}"
        engine.open_session(sid)
        run_turn(engine, sid, TURN_INPUT, greedy(TURN_NEW))
        assert engine.close_session(sid)
        with caplog.at_level(logging.ERROR, logger="replica.accounting"):
            caplog.clear()
            engine.step()  # idle: the invariant check runs, logs and counts
        (record,) = caplog.records
        assert record.levelno == logging.ERROR
        leaked = cycle * per
        free = CAP.max_sessions * per - leaked
        assert f"mamba: capacity=12 free={free} in_use=0 session_held=0 cached=0 " in (
            record.getMessage()
        )
        assert f"leaked={leaked}" in record.getMessage()
        # every check that sees the leak counts: this idle step, and from the second cycle on
        # also the step that ended the cycle's turn (the engine went idle there too)
        assert engine.checker.violations == 2 * cycle - 1
        snap = engine.snapshot()
        assert snap.pool("mamba").leaked == leaked
        assert snap.pool("kv_tokens").leaked == snap.pool("req").leaked == 0
    # every mamba slot has leaked: the replica can no longer hold a session
    with pytest.raises(PoolExhaustedError, match="0 mamba slots free"):
        engine.open_session("one-too-many")


def close_a_while_b_runs(engine, a_input: list[int] = TURN_INPUT) -> None:
    engine.open_session("a")
    engine.open_session("b")
    run_turn(engine, "a", a_input, greedy(TURN_NEW))
    engine.submit("b", TURN_INPUT, greedy(TURN_NEW))
    engine.step()
    assert engine.close_session("a")


def test_leaked_pages_shared_with_cached_states_are_reported_not_hidden():
    """With the turn-boundary cache on, a's end-of-turn state shares a's KV pages, so pages the
    release forgets are still held (by the cache entry) and the snapshot counts them as cached:
    only the reference counts show the leak. The detector reports it as a leak (strict: raises
    ``LeakError``), it does not take it for corruption and stop the engine."""
    engine = leaking_engine("leak_kv_on_release", strict=True, pools=CACHING)
    close_a_while_b_runs(engine)
    assert len(engine.sessions.cache), "the scenario needs a cached state"
    with pytest.raises(LeakError) as caught:
        drain(engine)
    message = str(caught.value)
    assert "kv_tokens: capacity=256 free=192" in message and "leaked=16" in message, message


def test_non_strict_page_reference_leak_is_logged_counted_and_the_engine_keeps_serving(caplog):
    """Sessions that share pages with cached states leak them on release: once the cache holds
    a page whose release was forgotten, only its reference count shows the leak."""
    engine = leaking_engine("leak_kv_on_release", strict=False, pools=CACHING)
    close_a_while_b_runs(engine, LONG_INPUT)
    with caplog.at_level(logging.ERROR, logger="replica.accounting"):
        drain(engine)
        for cycle in range(3):  # a's prompt again: the session starts from a's cached state
            sid = f"again{cycle}"
            assert engine.open_session(sid, prefix_ids=LONG_INPUT).cached_tokens > 0
            run_turn(engine, sid, [9], greedy(TURN_NEW))
            assert engine.close_session(sid)
            drain(engine)
    messages = [r.getMessage() for r in caplog.records]
    assert any("pages hold references nobody owns" in m for m in messages), messages
    assert engine.checker.violations >= 1
    # the replica still serves: a new session runs a turn
    engine.open_session("c")
    tokens, reason, _ = run_turn(engine, "c", TURN_INPUT, greedy(TURN_NEW))
    assert len(tokens) == TURN_NEW and reason is not None
