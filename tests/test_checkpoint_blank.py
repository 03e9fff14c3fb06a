"""A session that holds nothing yet is not exported but handed on as blank (id, tenant, idle
timeout), so that the store knows it when no router remembers it; blank entries wait, as drops
do, for a checkpoint to travel with; a session's first checkpoint or its release ends it."""

from __future__ import annotations

import asyncio

from replica.api import SessionStates
from replica.checkpoints.entries import DROP_DELAY_S, CheckpointBlank, CheckpointDrop
from replica.checkpoints.outbox import CheckpointOutbox
from tests.support.engine import close_and_check, greedy, make_engine, run_turn


def test_an_empty_open_is_blank_until_its_first_turn_and_released_as_any_session():
    engine = make_engine(session_checkpoints=True)
    engine.checkpoints.enabled = True  # as when a checkpoint store follows the replica
    engine.open_session("a", idle_timeout_s=30.0, tenant="t")
    batch = engine.session_ops.take_checkpoints()
    assert batch.saved == [] and batch.blank == [("a", "t", 30.0)]
    assert not engine.session_ops.take_checkpoints()  # reported once
    run_turn(engine, "a", [5, 6, 7], greedy(3))
    batch = engine.session_ops.take_checkpoints()
    assert batch.blank == [] and [r.sessions[0].session_id for r in batch.saved] == ["a"]
    engine.open_session("b")
    engine.session_ops.take_checkpoints()
    engine.close_session("b")  # released blank: its entry is dropped at the store
    assert engine.session_ops.take_checkpoints().dropped == ["b"]
    engine.open_session("p", prefix_ids=[5, 6])  # holds pending tokens: exported, not blank
    batch = engine.session_ops.take_checkpoints()
    assert batch.blank == [] and [r.sessions[0].session_id for r in batch.saved] == ["p"]
    close_and_check(engine)


def test_blank_entries_travel_with_the_next_checkpoint_or_alone_after_their_delay():
    engine = make_engine(session_checkpoints=True)
    engine.checkpoints.enabled = True
    engine.open_session("a")
    run_turn(engine, "a", [5, 6, 7], greedy(3))

    async def pull() -> None:
        outbox = CheckpointOutbox(lambda outputs: None, capacity=8)
        stream = outbox.stream(False)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        engine.open_session("b", idle_timeout_s=9.0)
        outbox.push(engine.session_ops.take_checkpoints())  # a's record and b's blank entry
        item = await first
        assert [type(e) for e in item] == [CheckpointBlank, SessionStates]
        assert item[0] == CheckpointBlank((("b", "", 9.0),))
        assert item[1].sessions[0].session_id == "a"
        engine.open_session("c")
        idle_s = engine.sessions.get("c").idle_timeout_s  # the replica's default
        outbox.push(engine.session_ops.take_checkpoints())
        started = asyncio.get_running_loop().time()
        assert await stream.__anext__() == [CheckpointBlank((("c", "", idle_s),))]
        assert asyncio.get_running_loop().time() - started >= DROP_DELAY_S * 0.9  # alone, late
        engine.close_session("c")
        outbox.push(engine.session_ops.take_checkpoints())
        assert await stream.__anext__() == [CheckpointDrop(("c",))]
        outbox.disconnect("the test ends")

    asyncio.run(pull())
    close_and_check(engine)


def test_an_empty_session_that_arrived_is_durable_once_its_blank_entry_is_stored():
    """A move waits (``durable``) until what a failover needs of each session it brought is
    stored: a checkpoint, or for a session that holds nothing its blank entry. Before, an empty
    session's move waited the whole stall bound for a checkpoint that never comes."""
    engine = make_engine(session_checkpoints=True)
    engine.checkpoints.enabled = True
    engine.open_session("empty", tenant="t")
    batch = engine.session_ops.take_checkpoints()
    assert batch.blank and not batch.saved

    async def scenario() -> tuple[bool, float]:
        outbox = CheckpointOutbox(lambda outputs: None, capacity=4, stall_s=5.0)
        stream = outbox.stream(confirm_on_ack=False)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        outbox.push(batch)
        durable = asyncio.ensure_future(outbox.durable(["empty"]))
        await asyncio.sleep(0)
        started = asyncio.get_running_loop().time()
        assert await first == [CheckpointBlank(tuple(batch.blank))]
        taken = asyncio.ensure_future(stream.__anext__())  # the store has it: stored
        result = await durable
        waited = asyncio.get_running_loop().time() - started
        outbox.disconnect("the test ends")
        await asyncio.gather(taken, return_exceptions=True)
        return result, waited

    result, waited = asyncio.run(scenario())
    assert result is True and waited < 1.0
    close_and_check(engine)
