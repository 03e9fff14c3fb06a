"""A step with token rows only goes from the engine thread straight to the gateways' outboxes when
nothing handed over before is still on its way through the event loop and nothing is held for a
checkpoint; everything else goes by the loop. Either way each session's outputs keep the engine's
order: the same tokens as the same turns run alone, the turn's end last."""

from __future__ import annotations

import asyncio
import threading
import time

from replica.api import TurnEvent
from replica.checkpoints.outbox import CheckpointOutbox
from replica.engine.async_engine import AsyncEngine
from replica.engine.step_outputs import StepOutputs
from tests.support.engine import close_and_check, greedy, make_engine, run_turn

SESSIONS = [f"s{i}" for i in range(4)]
PROMPTS = {sid: [5 + i, 6, 7 + 2 * i] for i, sid in enumerate(SESSIONS)}
NEW_TOKENS = 12


def expected() -> dict[str, list[int]]:
    engine = make_engine()
    want = {}
    for sid in SESSIONS:
        engine.open_session(sid)
        want[sid] = run_turn(engine, sid, PROMPTS[sid], greedy(NEW_TOKENS))[0]
        engine.close_session(sid)
    close_and_check(engine)
    return want


def delivered(take_rows: bool) -> tuple[dict[str, list], dict[str, int]]:
    """Each session's outputs in the order they were delivered (tokens, then "end"), and how
    many records went each way."""
    engine = make_engine()
    got: dict[str, list] = {sid: [] for sid in SESSIONS}
    ways = {"loop": 0, "direct": 0}
    lock = threading.Lock()

    def record(way: str, outputs: list[StepOutputs]) -> None:
        with lock:
            ways[way] += len(outputs)
            for out in outputs:
                for event in out:
                    got[event.session_id] += event.token_ids
                    if isinstance(event, TurnEvent) and event.finished:
                        got[event.session_id].append("end")

    def on_rows(outputs: list[StepOutputs]) -> bool:
        if take_rows:
            record("direct", outputs)
        return take_rows

    async def run() -> None:
        running = AsyncEngine(engine, lambda outputs: record("loop", outputs), on_rows=on_rows)
        for sid in SESSIONS:
            await running.call(engine.open_session, sid)
        for sid in SESSIONS:
            await running.call(engine.submit, sid, PROMPTS[sid], greedy(NEW_TOKENS))
        for _ in range(600):
            with lock:
                if all(tokens[-1:] == ["end"] for tokens in got.values()):
                    break
            await asyncio.sleep(0.01)
        for sid in SESSIONS:
            await running.call(engine.close_session, sid)
        running.stop()

    asyncio.run(run())
    close_and_check(engine)
    return got, ways


def test_rows_taken_on_the_engine_thread_keep_each_sessions_order():
    want = expected()
    got, ways = delivered(take_rows=True)
    assert got == {sid: [*tokens, "end"] for sid, tokens in want.items()}
    assert ways["direct"] > 0 and ways["loop"] > 0  # rows straight on; the ends by the loop


def test_rows_refused_on_the_engine_thread_go_by_the_loop_in_order():
    want = expected()
    got, ways = delivered(take_rows=False)
    assert got == {sid: [*tokens, "end"] for sid, tokens in want.items()}
    assert ways["direct"] == 0


def test_rows_wait_for_a_busy_loop_to_hand_over_what_came_before_them():
    """Barge-in while the event loop is slow: the interrupted turn's end goes by the loop, the
    next turn's rows come right after it on the engine thread; they must not overtake it."""
    engine = make_engine()
    seen: list[tuple[int, str]] = []  # (turn, "token" | "end") as delivered
    lock = threading.Lock()
    interrupted = threading.Event()

    def record(outputs: list[StepOutputs]) -> None:
        with lock:
            for out in outputs:
                for event in out:
                    seen.extend((event.turn_id, "token") for _ in event.token_ids)
                    if isinstance(event, TurnEvent) and event.finished:
                        seen.append((event.turn_id, "end"))

    def on_events(outputs: list[StepOutputs]) -> None:  # a busy loop, after the barge-in
        if interrupted.is_set():
            time.sleep(0.05)
        record(outputs)

    def on_rows(outputs: list[StepOutputs]) -> bool:
        record(outputs)
        return True

    def barge_in() -> None:
        engine.interrupt("s")
        engine.submit("s", [9, 10], greedy(NEW_TOKENS))
        interrupted.set()

    async def run() -> None:
        running = AsyncEngine(engine, on_events, on_rows=on_rows)
        await running.call(engine.open_session, "s")
        await running.call(engine.submit, "s", PROMPTS["s0"], greedy(200))
        while len(seen) < 5:
            await asyncio.sleep(0.005)
        await running.call(barge_in)
        for _ in range(600):
            with lock:
                if sum(kind == "end" for _, kind in seen) == 2:
                    break
            await asyncio.sleep(0.01)
        await running.call(engine.close_session, "s")
        running.stop()

    asyncio.run(run())
    close_and_check(engine)
    turns = [turn for turn, _ in seen]
    assert turns == sorted(turns), "a turn's output came after the next turn's"
    ends = [i for i, (_, kind) in enumerate(seen) if kind == "end"]
    assert len(ends) == 2 and ends[-1] == len(seen) - 1
    assert seen[ends[0]][0] < seen[ends[0] + 1][0]  # the first turn's end, then the next turn


def test_held_outputs_are_idle_only_while_nothing_is_held_waits_or_is_deferred():
    async def run() -> list[tuple[str, tuple[int, ...]]]:
        sent: list[StepOutputs] = []
        held = CheckpointOutbox(sent.extend, capacity=4).outputs
        assert held.idle
        held.wait("quick", 1, hold=False)  # its outputs go on meanwhile
        assert held.idle
        held.wait("slow", 2)
        assert not held.idle
        step = StepOutputs()
        step.add_rows(["slow", "quick"], [1, 1], ["g", "g"], [5, 6], ["a", "b"])
        held.dispatch([step])  # it waits whole for the store's next take (a few ms at most)
        assert not held.idle and sent == []
        held.stored(1)  # "quick"'s row goes on, "slow"'s is held
        assert not held.idle
        held.stored(2)
        assert held.idle
        return [(e.session_id, e.token_ids) for out in sent for e in out]

    assert asyncio.run(run()) == [("quick", (6,)), ("slow", (5,))]
