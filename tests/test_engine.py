"""The engine on tiny-bamba: batching, chunked prefill, atomic turns, barge-in, sampling, finish
reasons, typed errors and that every slot comes back. Every test closes all sessions at the end
and checks (strictly) that each pool is back at capacity with nothing leaked."""

from __future__ import annotations

import pytest

from replica.api import (
    ContextOverflowError,
    FinishReason,
    InvalidRequestError,
    PoolExhaustedError,
    SamplingParams,
    SessionNotFoundError,
    TurnEvent,
    TurnRunningError,
)
from replica.config import PoolConfig
from replica.engine.engine import Engine
from tests.support.engine import (
    assert_engine_at_capacity,
    assert_same_state,
    close_and_check,
    drain,
    greedy,
    make_engine,
    run_batch,
    run_turn,
    session_state,
    token_ids,
)
from tests.support.pools import FakeClock


def pools(**kwargs) -> PoolConfig:
    base = dict(max_sessions=8, kv_tokens=4096, max_context=512, page_size=1)
    base.update(kwargs)
    return PoolConfig(**base)


def step_until_tokens(engine: Engine, rid: int, n: int) -> tuple[list[int], list[TurnEvent]]:
    """Step until turn ``rid`` has streamed ``n`` tokens (without finishing)."""
    tokens, events = [], []
    while len(tokens) < n:
        assert engine.has_work
        for event in engine.step():
            events.append(event)
            if event.turn_id == rid:
                assert not event.finished, event
                tokens += event.token_ids
    return tokens, events


def end_event(events: list[TurnEvent], rid: int) -> TurnEvent:
    (event,) = [e for e in events if e.turn_id == rid and e.finished]
    return event


# ----- batching and chunking --------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 16])
def test_batch_invariance(page_size):
    """Greedy tokens of each session are the same alone and in a batch of 16."""
    prompts = {f"s{i}": token_ids(3 + 7 * i, seed=100 + i) for i in range(16)}
    new = {sid: 6 + (i % 5) * 3 for i, sid in enumerate(prompts)}
    engine = make_engine(pools(max_sessions=16, page_size=page_size), max_prefill_chunk=32)
    alone, alone_state = {}, {}
    for sid, ids in prompts.items():
        engine.open_session(sid)
        alone[sid] = run_turn(engine, sid, ids, greedy(new[sid]))[0]
        alone_state[sid] = session_state(engine, sid)
        engine.close_session(sid)
    assert_engine_at_capacity(engine)
    for sid in prompts:
        engine.open_session(sid)
    batched = run_batch(engine, {sid: (ids, greedy(new[sid])) for sid, ids in prompts.items()})
    assert batched == alone
    for sid in prompts:
        assert_same_state(session_state(engine, sid), alone_state[sid])
    # a second turn of every session, batched again, against each session alone
    second = {sid: token_ids(5, seed=200 + i) for i, sid in enumerate(prompts)}
    batched2 = run_batch(engine, {sid: (ids, greedy(5)) for sid, ids in second.items()})
    close_and_check(engine)
    for sid in ["s0", "s7", "s15"]:
        engine.open_session(sid)
        run_turn(engine, sid, prompts[sid], greedy(new[sid]))
        assert run_turn(engine, sid, second[sid], greedy(5))[0] == batched2[sid]
    close_and_check(engine)


def test_chunked_prefill_gives_same_tokens():
    """Chunks of 1, 7 and 64 tokens, interleaved with other sessions' decode, agree."""
    long_prompt, short_prompt, follow = token_ids(150, 1), token_ids(5, 2), token_ids(40, 3)
    results, states = [], []
    for chunk in (1, 7, 64):
        engine = make_engine(pools(page_size=16), max_prefill_chunk=chunk)
        engine.open_session("long")
        engine.open_session("short")
        first = run_batch(
            engine, {"long": (long_prompt, greedy(8)), "short": (short_prompt, greedy(30))}
        )
        second = run_turn(engine, "long", follow, greedy(8))[0]
        results.append((first, second))
        states.append([session_state(engine, sid) for sid in ("long", "short")])
        close_and_check(engine)
    assert results[0] == results[1] == results[2]
    for other in states[1:]:
        for got, want in zip(other, states[0]):
            assert_same_state(got, want)


def test_max_batch_tokens_bounds_each_step():
    engine = make_engine(pools(), max_prefill_chunk=64, max_batch_tokens=20)
    for i in range(4):
        engine.open_session(f"s{i}")
        engine.submit(f"s{i}", token_ids(50, i), greedy(4))
    while engine.has_work:
        plan = engine.scheduler.plan()
        assert len(plan.decode) + sum(n for _, n in plan.prefill) <= 20
        engine.step()
    close_and_check(engine)


# ----- atomic turns: cancel and roll back -------------------------------------------------------


@pytest.mark.parametrize("track", [1, 2])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("during", ["decode", "prefill"])
def test_cancel_rolls_back_with_track_buffer(track, page_size, during):
    a, b, c = token_ids(20, 1), token_ids(45, 2), token_ids(7, 3)
    # no cached states: the KV tail must come back free, not be kept by a state cached mid-turn
    sizes = pools(page_size=page_size, mamba_track_buffers=track, max_cached_states=0)
    engine = make_engine(sizes, max_prefill_chunk=8)
    engine.open_session("ref")
    engine.open_session("x")
    o1_ref, _, committed = run_turn(engine, "ref", a, greedy(9))
    o1, _, _ = run_turn(engine, "x", a, greedy(9))
    assert o1 == o1_ref
    free_before = engine.snapshot().pool("kv_tokens").free
    req = engine.submit("x", b, greedy(30))
    if during == "decode":
        step_until_tokens(engine, req.rid, 5)
    else:
        engine.step()
        engine.step()
        assert req.turn_folded > 0 and not req.output_ids
    assert engine.cancel("x")
    event = end_event(drain(engine), req.rid)
    assert event.error_code == "CANCELLED" and event.finish_reason is None
    assert event.committed_tokens == committed == engine.session_info("x").committed_tokens
    assert engine.snapshot().pool("kv_tokens").free == free_before  # the KV tail is freed
    engine.check_invariant()
    assert_same_state(session_state(engine, "x"), session_state(engine, "ref"), exact=True)
    want, _, want_committed = run_turn(engine, "ref", c, greedy(10))
    got, _, got_committed = run_turn(engine, "x", c, greedy(10))
    assert got == want and got_committed == want_committed
    assert_same_state(session_state(engine, "x"), session_state(engine, "ref"), exact=True)
    assert not engine.cancel("x")  # nothing running
    close_and_check(engine)


@pytest.mark.parametrize("page_size", [1, 16])
def test_cancel_without_track_buffer_commits_exactly_what_was_processed(page_size):
    a, b, c = token_ids(20, 1), token_ids(30, 2), token_ids(7, 3)
    engine = make_engine(pools(page_size=page_size, mamba_track_buffers=0))
    engine.open_session("x")
    o1, _, committed = run_turn(engine, "x", a, greedy(9))
    req = engine.submit("x", b, greedy(30))
    streamed, _ = step_until_tokens(engine, req.rid, 6)
    engine.cancel("x")
    event = end_event(drain(engine), req.rid)
    assert event.error_code == "CANCELLED"
    assert event.committed_tokens == committed + len(b) + len(streamed)
    assert engine.session_info("x").committed_tokens == event.committed_tokens
    got, _, got_committed = run_turn(engine, "x", c, greedy(10))
    # a session fed the same tokens explicitly
    engine.open_session("ref")
    assert run_turn(engine, "ref", a, greedy(9))[0] == o1
    assert run_turn(engine, "ref", b + streamed, greedy(0))[2] == event.committed_tokens
    want, _, want_committed = run_turn(engine, "ref", c, greedy(10))
    assert got == want and got_committed == want_committed
    assert_same_state(session_state(engine, "x"), session_state(engine, "ref"))
    close_and_check(engine)


def test_cancel_waiting_turn_changes_nothing():
    engine = make_engine(pools(kv_tokens=64, max_context=64))
    engine.open_session("a")
    engine.open_session("b")
    ra = engine.submit("a", token_ids(40, 1), greedy(10))
    engine.step()
    rb = engine.submit("b", token_ids(30, 2), greedy(4))  # waits: KV is reserved by "a"
    engine.step()
    assert rb in engine.scheduler.waiting
    assert engine.cancel("b")
    events = drain(engine)
    assert end_event(events, rb.rid).error_code == "CANCELLED"
    assert end_event(events, ra.rid).finish_reason is FinishReason.LENGTH
    assert engine.session_info("b").committed_tokens == 0
    close_and_check(engine)


# ----- barge-in ---------------------------------------------------------------------------------


@pytest.mark.parametrize("track", [0, 1])
@pytest.mark.parametrize("during", ["decode", "prefill"])
def test_interrupt_keeps_generated_tokens(track, during):
    a, b, c = token_ids(12, 1), token_ids(40, 2), token_ids(6, 3)
    engine = make_engine(pools(mamba_track_buffers=track, page_size=16), max_prefill_chunk=8)
    engine.open_session("x")
    o1, _, committed = run_turn(engine, "x", a, greedy(5))
    req = engine.submit("x", b, greedy(50))
    if during == "decode":
        streamed, _ = step_until_tokens(engine, req.rid, 7)
    else:
        engine.step()
        streamed = []
    assert engine.interrupt("x")
    event = end_event(engine.take_events(), req.rid)
    assert event.finish_reason is FinishReason.INTERRUPTED and event.error_code is None
    assert event.committed_tokens == committed + len(b) + len(streamed)
    assert engine.session_info("x").committed_tokens == event.committed_tokens
    assert not engine.has_work
    got = run_turn(engine, "x", c, greedy(8))
    engine.open_session("ref")
    run_turn(engine, "ref", a, greedy(5))
    run_turn(engine, "ref", b + streamed, greedy(0))
    assert run_turn(engine, "ref", c, greedy(8)) == got
    assert_same_state(session_state(engine, "x"), session_state(engine, "ref"))
    assert not engine.interrupt("x")
    close_and_check(engine)


def test_interrupt_waiting_turn():
    engine = make_engine(pools(kv_tokens=64, max_context=64))
    engine.open_session("a")
    engine.open_session("b")
    engine.submit("a", token_ids(50, 1), greedy(10))
    engine.step()
    rb = engine.submit("b", token_ids(20, 2), greedy(4))
    engine.step()
    assert engine.interrupt("b")
    event = end_event(engine.take_events(), rb.rid)
    # like an interrupted running turn, the input stays in the conversation (folded next turn)
    assert event.finish_reason is FinishReason.INTERRUPTED and event.committed_tokens == 20
    assert engine.session_info("b").committed_tokens == 20
    drain(engine)
    engine.close_session("a")  # make room in the tiny KV pool for a reference session
    got = run_turn(engine, "b", token_ids(6, 3), greedy(4))
    engine.open_session("ref")
    run_turn(engine, "ref", token_ids(20, 2), greedy(0))
    assert run_turn(engine, "ref", token_ids(6, 3), greedy(4)) == got
    assert_same_state(session_state(engine, "b"), session_state(engine, "ref"))
    close_and_check(engine)


# ----- sampling ---------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    prompt = token_ids(16, 1)

    def sp(seed: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=seed)

    engine = make_engine(pools(max_sessions=8))
    for i in range(5):
        engine.open_session(f"s{i}")
    # same seed on the same state: same tokens, alone or batched with other sessions
    engine.open_session("alone")
    alone = run_turn(engine, "alone", prompt, sp(42))[0]
    out = run_batch(
        engine,
        {
            "s0": (prompt, sp(42)),
            "s1": (prompt, sp(42)),
            "s2": (prompt, sp(43)),
            "s3": (prompt, sp(2**64 - 1)),
            "s4": (token_ids(40, 9), greedy(30)),
        },
    )
    assert out["s0"] == out["s1"] == alone
    assert out["s2"] != out["s0"] and out["s3"] != out["s0"] and out["s3"] != out["s2"]
    greedy_tokens = run_turn(engine, "alone", prompt, greedy(24))[0]
    assert greedy_tokens != alone
    # the same seed on the next turn of equal sessions agrees again
    follow = token_ids(4, 5)
    out = run_batch(engine, {"s0": (follow, sp(7)), "s1": (follow, sp(7))})
    assert out["s0"] == out["s1"]
    close_and_check(engine)


def test_top_p_tiny_is_greedy():
    prompt = token_ids(16, 1)
    engine = make_engine(pools())
    engine.open_session("a")
    engine.open_session("b")
    tiny_p = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1e-6, seed=3)
    out = run_batch(engine, {"a": (prompt, tiny_p), "b": (prompt, greedy(12))})
    assert out["a"] == out["b"]
    close_and_check(engine)


# ----- finish reasons ---------------------------------------------------------------------------


def test_stop_token_and_length():
    prompt = token_ids(10, 1)
    engine = make_engine(pools())
    engine.open_session("ref")
    ref, reason, committed = run_turn(engine, "ref", prompt, greedy(20))
    assert len(ref) == 20 and reason is FinishReason.LENGTH and committed == 30
    i = next(i for i in range(3, 20) if ref[i] not in ref[:i])
    engine.open_session("x")
    tokens, reason, committed = run_turn(engine, "x", prompt, greedy(20, stop=[ref[i], 383]))
    assert tokens == ref[: i + 1] and reason is FinishReason.STOP
    assert committed == 10 + i + 1
    # the stop token is kept in the session: the next turn continues after it
    follow = token_ids(5, 2)
    got = run_turn(engine, "x", follow, greedy(6))[0]
    engine.open_session("y")
    run_turn(engine, "y", prompt + ref[: i + 1], greedy(0))
    assert run_turn(engine, "y", follow, greedy(6))[0] == got
    assert_same_state(session_state(engine, "x"), session_state(engine, "y"))
    # a stop token as the very first generated token
    engine.open_session("z")
    tokens, reason, committed = run_turn(engine, "z", prompt, greedy(20, stop=[ref[0]]))
    assert tokens == ref[:1] and reason is FinishReason.STOP and committed == 11
    # max_new_tokens=1: one token, LENGTH
    engine.open_session("w")
    assert run_turn(engine, "w", prompt, greedy(1)) == (ref[:1], FinishReason.LENGTH, 11)
    close_and_check(engine)


def test_append_only_turns():
    a, b = token_ids(25, 1), token_ids(11, 2)
    engine = make_engine(pools(page_size=16), max_prefill_chunk=10)
    engine.open_session("x")
    assert run_turn(engine, "x", a, greedy(0)) == ([], FinishReason.LENGTH, 25)
    assert run_turn(engine, "x", b, greedy(0)) == ([], FinishReason.LENGTH, 36)
    assert run_turn(engine, "x", [], greedy(0)) == ([], FinishReason.LENGTH, 36)
    got = run_turn(engine, "x", [5], greedy(7))
    engine.open_session("y")
    assert run_turn(engine, "y", a + b + [5], greedy(7)) == got
    assert_same_state(session_state(engine, "x"), session_state(engine, "y"))
    # after a generating turn, an empty append folds the pending last token
    assert run_turn(engine, "y", [], greedy(0)) == ([], FinishReason.LENGTH, 44)
    assert engine.sessions.get("y").pending_ids == ()
    close_and_check(engine)


def test_empty_input_generates_from_pending_token():
    prompt = token_ids(9, 4)
    engine = make_engine(pools())
    engine.open_session("x")
    first = run_turn(engine, "x", prompt, greedy(4))[0]
    more = run_turn(engine, "x", [], greedy(4))[0]
    engine.open_session("y")
    assert run_turn(engine, "y", prompt, greedy(8))[0] == first + more
    assert_same_state(session_state(engine, "x"), session_state(engine, "y"))
    close_and_check(engine)


# ----- typed errors -----------------------------------------------------------------------------


def test_typed_errors():
    engine = make_engine(pools(max_sessions=2, max_context=64))
    with pytest.raises(SessionNotFoundError):
        engine.submit("nope", [1, 2], greedy(2))
    with pytest.raises(SessionNotFoundError):
        engine.session_info("nope")
    assert not engine.interrupt("nope") and not engine.cancel("nope")
    assert not engine.close_session("nope")
    engine.open_session("a")
    with pytest.raises(InvalidRequestError):
        engine.open_session("a")  # already open
    for bad in ([-1], [384], [1, 2, 10**6]):
        with pytest.raises(InvalidRequestError):
            engine.submit("a", bad, greedy(2))
    with pytest.raises(InvalidRequestError):
        engine.submit("a", [1], greedy(2, stop=[384]))
    with pytest.raises(InvalidRequestError):
        engine.submit("a", [], greedy(2))  # nothing to generate from
    for kwargs in (
        {"temperature": -0.5},
        {"temperature": float("nan")},
        {"top_p": 1.5},
        {"top_p": -0.1},
        {"max_new_tokens": -1},
        {"seed": -1},
        {"seed": 2**64},
        {"top_k": -1},
        {"stop": ("",)},
        {"stop": ("x" * 257,)},
        {"stop": tuple("abcdefghijklmnopq")},  # 17 stop strings
    ):
        with pytest.raises(InvalidRequestError):
            SamplingParams(**kwargs)
    with pytest.raises(ContextOverflowError):
        engine.submit("a", token_ids(60, 1), greedy(5))
    run_turn(engine, "a", token_ids(30, 1), greedy(4))
    with pytest.raises(ContextOverflowError):  # 34 committed + 20 + 11 > 64
        engine.submit("a", token_ids(20, 2), greedy(11))
    engine.submit("a", token_ids(20, 2), greedy(10))  # exactly 64 fits
    with pytest.raises(TurnRunningError):
        engine.submit("a", [1], greedy(1))
    engine.step()
    with pytest.raises(TurnRunningError):
        engine.submit("a", [1], greedy(1))
    assert engine.session_info("a").turn_running
    drain(engine)
    assert engine.session_info("a").committed_tokens == 64
    engine.open_session("b")
    with pytest.raises(PoolExhaustedError):
        engine.open_session("c")
    engine.close_session("b")
    with pytest.raises(SessionNotFoundError):
        engine.submit("b", [1], greedy(1))
    engine.open_session("c")  # room again
    assert not engine.has_work
    close_and_check(engine)


def test_turn_that_can_never_fit_is_refused():
    """A turn whose KV reservation exceeds what can ever be free ends with RESOURCE_EXHAUSTED."""
    engine = make_engine(pools(kv_tokens=96, max_context=512, page_size=16))
    engine.open_session("big")
    req = engine.submit("big", token_ids(100, 1), greedy(4))
    event = end_event(drain(engine), req.rid)
    assert event.error_code == "RESOURCE_EXHAUSTED" and "KV" in event.error
    assert engine.session_info("big").committed_tokens == 0
    # it waits while another turn runs, and is refused once it alone cannot fit
    engine.open_session("small")
    small = engine.submit("small", token_ids(30, 2), greedy(20))
    req = engine.submit("big", token_ids(80, 3), greedy(4))
    events = drain(engine)
    assert end_event(events, small.rid).finish_reason is FinishReason.LENGTH
    refused = end_event(events, req.rid)
    assert refused.error_code == "RESOURCE_EXHAUSTED"  # "small" holds 64 of 96 KV slots
    engine.close_session("small")
    assert run_turn(engine, "big", token_ids(80, 3), greedy(4))[1] is FinishReason.LENGTH
    close_and_check(engine)


# ----- close during a turn ----------------------------------------------------------------------


@pytest.mark.parametrize("track", [0, 1, 2])
def test_close_during_turn_frees_everything(track):
    engine = make_engine(pools(mamba_track_buffers=track, page_size=16), max_prefill_chunk=16)
    engine.open_session("keep")
    engine.open_session("ref")
    keep_prompt = token_ids(20, 9)
    want = run_turn(engine, "ref", keep_prompt, greedy(20))[0]
    engine.close_session("ref")
    engine.open_session("x")
    run_turn(engine, "x", token_ids(30, 1), greedy(5))
    rk = engine.submit("keep", keep_prompt, greedy(20))
    rx = engine.submit("x", token_ids(40, 2), greedy(30))
    events = engine.step() + engine.step() + engine.step()
    assert engine.close_session("x")
    snap = engine.check_invariant()
    assert snap.open_sessions == 1 and snap.running_requests == 1
    assert not engine.close_session("x")  # idempotent
    with pytest.raises(SessionNotFoundError):
        engine.submit("x", [1], greedy(1))
    events += drain(engine)
    assert end_event(events, rx.rid).error_code == "CANCELLED"
    assert [t for e in events if e.turn_id == rk.rid for t in e.token_ids] == want
    assert engine.sessions.released_total["closed"] == 2
    # close a session whose turn is still waiting
    engine.open_session("w")
    engine.submit("w", [1, 2, 3], greedy(3))
    engine.close_session("w")
    assert not engine.has_work
    engine.close_session("keep")
    assert_engine_at_capacity(engine)
    close_and_check(engine)


def test_close_all_during_turns():
    engine = make_engine(pools(max_sessions=8, page_size=16))
    for i in range(8):
        engine.open_session(f"s{i}")
        engine.submit(f"s{i}", token_ids(10 + i, i), greedy(20))
    for _ in range(4):
        engine.step()
    assert engine.snapshot().running_requests > 0
    engine.session_ops.close_all()
    assert not engine.has_work
    events = engine.take_events()
    assert len([e for e in events if e.error_code == "CANCELLED"]) == 8
    close_and_check(engine)


def test_idle_sessions_are_released():
    clock = FakeClock()
    engine = make_engine(pools(), clock=clock, session_idle_timeout_s=0.05)
    engine.open_session("a")
    engine.open_session("b", idle_timeout_s=60.0)  # capped by the server's 0.05 s
    run_turn(engine, "a", [1, 2, 3], greedy(2))
    engine.submit("b", [4, 5], greedy(2))  # a waiting turn keeps its session
    clock.now += 0.1
    assert engine.release_idle() == ["a"]
    drain(engine)  # b's turn ends now: it was active just now
    assert engine.release_idle() == []
    clock.now += 0.1
    assert engine.release_idle() == ["b"]
    assert engine.sessions.released_total["idle_timeout"] == 2
    close_and_check(engine)


def test_the_snapshot_counts_forwards_and_their_rows():
    """Three turns submitted together: one prefill forward of three chunks (which samples each
    turn's first token), then one decode forward of three rows for each further token."""
    engine = make_engine(pools())
    for sid in "abc":
        engine.open_session(sid)
    before = engine.snapshot().steps
    sampling = SamplingParams(max_new_tokens=4, ignore_eos=True)
    out = run_batch(engine, {sid: (token_ids(5, seed=i), sampling) for i, sid in enumerate("abc")})
    assert {sid: len(tokens) for sid, tokens in out.items()} == {"a": 4, "b": 4, "c": 4}
    after = engine.snapshot().steps
    prefill = (after.prefill_steps_total, after.prefill_rows_total)
    decode = (after.decode_steps_total, after.decode_rows_total)
    assert prefill == (before.prefill_steps_total + 1, before.prefill_rows_total + 3)
    assert decode == (before.decode_steps_total + 3, before.decode_rows_total + 9)
    close_and_check(engine)
