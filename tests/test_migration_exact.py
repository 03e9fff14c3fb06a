"""Migration is exact: a session exported by one engine and imported by another continues with
exactly the tokens it would have produced unmoved (greedy and seeded sampling), whether it was
idle and resident, parked, or just done with a turn that was running when the move began; on
the transformers peer model its greedy tokens equal ``BambaForCausalLM``'s over the whole
conversation. The accounting is exact on both engines at every step of the move, and refused
moves (another model, no room, a session moving) take nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from replica.api import (
    IncompatibleStateError,
    PoolExhaustedError,
    ReleaseReason,
    SamplingParams,
    SessionMovingError,
    StatusCode,
)
from replica.config import PoolConfig
from replica.engine.moves import MARK_TTL_S
from replica.model import build_tiny_bamba
from tests.support.engine import (
    assert_engine_at_capacity,
    assert_same_state,
    close_and_check,
    drain,
    greedy,
    make_checkpoint_engine,
    make_engine,
    run_turn,
    session_state,
    token_ids,
)
from tests.support.hf_peer import hf_greedy, saved_peer
from tests.support.pools import FakeClock

SEEDED = SamplingParams(max_new_tokens=7, temperature=0.9, top_p=0.9, seed=1234)


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """A tiny random HF Bamba and the checkpoint it saved: (hf model, path)."""
    return saved_peer(tmp_path_factory, seed=5)


def checked(*engines) -> None:
    """The strict invariant (leaked == 0 on every pool, allocator integrity) on each engine."""
    for engine in engines:
        assert engine.check_invariant().leaked == 0


def move(source, target, session_id: str) -> None:
    """Export ``session_id`` from ``source``, import it on ``target``, finish the move; the
    state arrives bit for bit and both engines' accounting is exact after every step."""
    before = session_state(source, session_id)
    exported, record = source.moves.export([session_id])
    assert exported.exported == (session_id,) and not exported.busy
    checked(source, target)
    imported = target.moves.import_([record])
    assert [i.session_id for i in imported.opened] == [session_id] and not imported.refused
    assert imported.snapshot.consistent
    checked(source, target)
    source.moves.finish([session_id], moved=True)
    checked(source, target)
    assert session_id not in source.sessions.sessions
    assert_same_state(session_state(target, session_id), before, exact=True)


@pytest.mark.parametrize("when", ["idle", "parked", "after_turn"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_a_moved_session_continues_exactly(peer, when, page_size):
    hf, path = peer
    pools = PoolConfig(
        max_sessions=2, kv_tokens=1024, max_context=256, page_size=page_size, max_parked_sessions=4
    )
    source, target, unmoved = (make_checkpoint_engine(path, pools) for _ in range(3))
    a, b, c = token_ids(23, 1), token_ids(9, 2), token_ids(5, 3)
    for engine in (source, unmoved):
        engine.open_session("s", tenant="t")
    o1 = run_turn(source, "s", a, greedy(6))[0]
    assert o1 == run_turn(unmoved, "s", a, greedy(6))[0] == hf_greedy(hf, a, 6)

    if when == "parked":
        source.sessions.residency.park([source.sessions.get("s")])
    if when == "after_turn":  # the move begins while a turn runs; it waits for the turn's end
        turn = source.submit("s", b, greedy(4))
        events = source.step()
        assert source.moves.mark(["s"]).busy == ("s",)
        events += drain(source)
        produced = [t for e in events if e.turn_id == turn.rid for t in e.token_ids]
        assert produced == run_turn(unmoved, "s", b, greedy(4))[0]
        assert source.moves.busy(["s"]) == []
        b = []
    move(source, target, "s")
    assert target.sessions.get("s").tenant == "t"
    assert source.snapshot().sessions_released_total == {ReleaseReason.MIGRATED.value: 1}

    o2 = run_turn(target, "s", b + c, greedy(8))[0]
    assert o2 == run_turn(unmoved, "s", b + c, greedy(8))[0]
    o3 = run_turn(target, "s", c, SEEDED)[0]
    assert o3 == run_turn(unmoved, "s", c, SEEDED)[0]
    assert_same_state(session_state(target, "s"), session_state(unmoved, "s"), exact=True)
    for engine in (source, target, unmoved):
        close_and_check(engine)


def test_greedy_continuation_matches_transformers_after_a_move(peer):
    hf, path = peer
    pools = PoolConfig(max_sessions=2, kv_tokens=1024, max_context=256, page_size=16)
    source, target = make_checkpoint_engine(path, pools), make_checkpoint_engine(path, pools)
    a, b = token_ids(31, 7), token_ids(12, 8)
    source.open_session("s")
    o1 = run_turn(source, "s", a, greedy(5))[0]
    move(source, target, "s")
    o2 = run_turn(target, "s", b, greedy(9))[0]
    assert o2 == hf_greedy(hf, a + o1 + b, 9)
    for engine in (source, target):
        close_and_check(engine)


def test_a_batch_of_resident_and_parked_sessions_moves_in_one_record():
    pools = PoolConfig(max_sessions=3, kv_tokens=2048, max_context=256, max_parked_sessions=4)
    source, target, unmoved = make_engine(pools), make_engine(pools), make_engine(pools)
    ids = [f"s{i}" for i in range(5)]  # 3 resident, 2 parked after the last turns
    outputs = {}
    for n, sid in enumerate(ids):
        for engine in (source, unmoved):
            engine.open_session(sid)
            outputs[engine, sid] = run_turn(engine, sid, token_ids(10 + n, n), greedy(3))[0]
    assert len(source.sessions.parked) == 2
    exported, record = source.moves.export(ids)
    assert sorted(exported.exported) == ids and len(record.sessions) == 5
    imported = target.moves.import_([record])
    assert sorted(i.session_id for i in imported.opened) == ids
    assert sum(i.parked for i in imported.opened) == 2  # the target's GPU holds 3, like the source
    source.moves.finish(ids, moved=True)
    checked(source, target)
    assert_engine_at_capacity(source)
    for n, sid in enumerate(ids):
        more = token_ids(4, 50 + n)
        assert run_turn(target, sid, more, SEEDED)[0] == run_turn(unmoved, sid, more, SEEDED)[0]
    for engine in (source, target, unmoved):
        close_and_check(engine)


def test_state_of_another_model_or_format_is_refused_and_takes_nothing():
    source = make_engine()
    other_weights = build_tiny_bamba(seed=1)
    target = make_engine(model=other_weights)
    assert source.fingerprint != target.fingerprint
    source.open_session("s")
    run_turn(source, "s", token_ids(8, 1), greedy(2))
    _, record = source.moves.export(["s"])
    with pytest.raises(IncompatibleStateError) as refused:
        target.moves.import_([record])
    assert refused.value.code == StatusCode.FAILED_PRECONDITION
    assert "model" in str(refused.value)
    with pytest.raises(IncompatibleStateError):
        make_engine().moves.import_([dataclasses.replace(record, format=record.format + 1)])
    assert_engine_at_capacity(target)
    source.moves.finish(["s"], moved=False)  # the move is given up: the session goes on
    run_turn(source, "s", token_ids(3, 2), greedy(2))
    close_and_check(source)


def test_a_target_without_room_refuses_those_sessions_and_keeps_the_others():
    source = make_engine(PoolConfig(max_sessions=4, kv_tokens=2048, max_context=256))
    target = make_engine(PoolConfig(max_sessions=2, kv_tokens=2048, max_context=256))
    target.open_session("resident")
    ids = ["a", "b", "c"]
    for sid in ids:
        source.open_session(sid)
        run_turn(source, sid, token_ids(6, len(sid)), greedy(2))
    _, record = source.moves.export(ids)
    imported = target.moves.import_([record])
    assert [i.session_id for i in imported.opened] == ["a"]
    assert set(imported.refused) == {"b", "c"}
    assert {e.code for e in imported.refused.values()} == {PoolExhaustedError.code}
    checked(source, target)
    source.moves.finish(["a"], moved=True)
    source.moves.finish(["b", "c"], moved=False)
    for sid in ("b", "c"):
        run_turn(source, sid, token_ids(2, 9), greedy(2))  # unmarked: they go on where they were
    for engine in (source, target):
        close_and_check(engine)


def test_a_moving_session_takes_no_turn_and_no_close_until_its_move_ends():
    engine = make_engine()
    clock = FakeClock()
    engine.sessions.clock = engine.sessions.residency.clock = clock
    engine.open_session("s", idle_timeout_s=10)
    run_turn(engine, "s", token_ids(5, 1), greedy(2))
    assert engine.moves.mark(["s", "gone"]).missing == ("gone",)
    with pytest.raises(SessionMovingError) as moving:
        engine.submit("s", token_ids(2, 2), greedy(2))
    assert moving.value.code == StatusCode.UNAVAILABLE
    with pytest.raises(SessionMovingError):
        engine.close_session("s")
    clock.now += MARK_TTL_S / 2  # idle past its timeout, but moving: the move ends it, or not
    assert engine.release_idle() == [] and engine.sessions.get("s").moving
    clock.now += MARK_TTL_S  # a mark this old outlived the router that set it: dropped
    assert engine.release_idle() == ["s"]
    close_and_check(engine)
