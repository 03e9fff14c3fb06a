"""One output record per engine step, from the engine to the gateway's calls: the replica's outbox
sends each gateway its rows (split only when a step's turns go to several) and the gateway's pump
hands them to its sessions, which stream exactly the engine's text; checkpoint holds keep back
only the rows of the sessions they hold, in order. (That a decode step's calls do not grow with
its batch: ``tests/test_batch_sampling.py``.)"""

from __future__ import annotations

import asyncio
import time

import pytest

from replica.actor.gateway_outputs import GatewayOutputs
from replica.api import FinishReason, SamplingParams, TurnEvent
from replica.checkpoints.entries import DROP_DELAY_S, CheckpointDrop
from replica.checkpoints.held_outputs import STEP_WAIT_S
from replica.checkpoints.log import CheckpointBatch
from replica.checkpoints.outbox import CheckpointOutbox
from replica.engine.step_outputs import StepOutputs
from router.gateway.delivery import hand_out
from router.gateway.inbox import Inbox, pieces
from tests.support.engine import close_and_check, greedy, make_engine, run_turn


def test_step_records_reach_each_gateways_sessions_as_the_engine_made_them():
    """Sessions of two gateways decode together; each gateway's stream, fanned out to its
    sessions' inboxes, gives each turn the tokens and text of the engine's records and its end,
    in order."""
    engine = make_engine()
    gateway_of = {f"s{i}": ("gw-a" if i % 3 else "gw-b") for i in range(6)}
    for i, (sid, gateway) in enumerate(gateway_of.items()):
        engine.open_session(sid, gateway_id=gateway)
        engine.submit(sid, [40 + i, 50, 60], SamplingParams(12), gateway_id=gateway)
    records = []
    while engine.has_work:
        records.append(engine.step())
    want: dict[str, tuple[list[int], str, FinishReason | None]] = {}
    for event in (event for record in records for event in record):
        tokens, text, _ = want.get(event.session_id, ([], "", None))
        want[event.session_id] = (
            tokens + list(event.token_ids),
            text + event.text,
            event.finish_reason,
        )
    assert all(len(tokens) == 12 for tokens, _, _ in want.values())

    async def deliver() -> dict[str, tuple[list[int], str, FinishReason | None]]:
        outputs = GatewayOutputs()
        outputs.dispatch(records)  # several steps, unread: one item per gateway, rows merged
        outputs.close()
        got = {}
        for gateway in ("gw-a", "gw-b"):
            items = [item async for item in outputs.stream_async(gateway)]
            assert len(items) == 1
            assert sum(type(entry) is tuple for entry in items[0]) < len(records)
            inboxes = {s: Inbox(s, "r") for s, g in gateway_of.items() if g == gateway}
            hand_out(items[0], inboxes)
            for sid, inbox in inboxes.items():
                (piece,) = pieces(await inbox.take())
                assert piece.end is not None
                got[sid] = (piece.token_ids, piece.text, piece.end.finish_reason)
        return got

    assert asyncio.run(deliver()) == want
    for tokens, text, _ in want.values():
        assert text == engine.tokenizer.decode(tokens)
    close_and_check(engine)


def test_checkpoint_holds_keep_back_the_rows_of_held_sessions_only():
    sent: list[StepOutputs] = []
    outbox = CheckpointOutbox(sent.extend, capacity=4)
    end = TurnEvent("held", 1, (5,), "e", FinishReason.STOP, 3, gateway_id="g")
    outbox.outputs.holds.hold(end)  # its turn's end waits for its checkpoint
    step = StepOutputs()
    step.add_rows(["free", "held", "free2"], [7, 2, 8], ["g"] * 3, [65, 66, 67], ["A", "B", "C"])
    outbox.dispatch([step])
    assert [(e.session_id, e.token_ids, e.text) for e in sent[0]] == [
        ("free", (65,), "A"),
        ("free2", (67,), "C"),
    ]
    outbox.outputs.holds.release("held")  # its checkpoint is stored: what it held goes on, in order
    assert [(e.session_id, e.turn_id, e.finished) for e in sent[1]] == [
        ("held", 1, True),
        ("held", 2, False),
    ]


def test_a_turn_end_goes_on_once_the_store_has_its_checkpoint_not_at_its_ack():
    """The store pulls with a backpressure of one item, so the stream is resumed past an item
    only once the store has it: the turn's end held for that checkpoint goes on then, with no
    acknowledgement (those carry the store's counts). A store that writes to disk first
    confirms by acknowledgement instead, and the end waits for it."""
    engine = make_engine()
    engine.open_session("s")
    run_turn(engine, "s", [5, 6, 7], greedy(3))
    record = engine.transfer.export([engine.sessions.get("s")])
    end = TurnEvent("s", 1, (9,), "e", FinishReason.STOP, 7, gateway_id="g")

    async def pull(confirm_on_ack: bool) -> list[list]:
        sent: list = []
        outbox = CheckpointOutbox(sent.extend, capacity=4)
        stream = outbox.stream(confirm_on_ack)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the store's call has started: it follows
        outbox.push(CheckpointBatch(saved=[record]))
        outbox.dispatch([StepOutputs([end])])
        assert await first == [record] and sent == []  # yielded, not yet taken: held
        after = [sent[:]]
        resumed = asyncio.ensure_future(stream.__anext__())  # the store took it
        await asyncio.sleep(0)
        after.append(sent[:])
        outbox.acked(1, 1, record.nbytes)
        after.append(sent[:])
        assert outbox.pool_stats().session_held == 1 and outbox.pool_stats().free == 3
        outbox.disconnect("the test ends")
        with pytest.raises(StopAsyncIteration):  # the stream ends with its store
            await resumed
        return after

    async def both():
        return await pull(False), await pull(True)

    received, confirmed = asyncio.run(both())
    ends = [[e.session_id for out in step for e in out] for step in received]
    assert ends == [[], ["s"], ["s"]]  # on at the store's pull, before any acknowledgement
    ends = [[e.session_id for out in step for e in out] for step in confirmed]
    assert ends == [[], [], ["s"]]  # on at the acknowledgement
    close_and_check(engine)


def test_drops_travel_with_the_next_checkpoint_or_alone_after_their_delay():
    """Nothing waits for a drop, so drops alone do not make a stream item: they go with the
    next checkpoint, or alone once ``DROP_DELAY_S`` has passed; entries keep their order and
    numbers, so each acknowledgement's accounting stays exact (0 leaked)."""
    engine = make_engine()
    for sid in ("a", "b"):
        engine.open_session(sid)
        run_turn(engine, sid, [5, 6, 7], greedy(2))
    record_a, record_b = (engine.transfer.export([engine.sessions.get(s)]) for s in "ab")

    async def pull() -> None:
        outbox = CheckpointOutbox([].extend, capacity=4)
        stream = outbox.stream(False)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        outbox.push(CheckpointBatch(saved=[record_a]))
        assert await first == [record_a]
        outbox.acked(1, 1, record_a.nbytes)
        outbox.push(CheckpointBatch(dropped=["a"], released=["a"]))
        second = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(DROP_DELAY_S / 2)
        assert not second.done()  # the drop alone waits
        outbox.push(CheckpointBatch(saved=[record_b]))
        assert await second == [CheckpointDrop(("a",)), record_b]  # in order, one item
        outbox.acked(3, 1, record_b.nbytes)  # the store holds b only
        assert outbox.pool_stats().session_held == 1 and outbox.pool_stats().leaked == 0
        outbox.push(CheckpointBatch(dropped=["b"], released=["b"]))
        started = time.monotonic()
        assert await stream.__anext__() == [CheckpointDrop(("b",))]  # alone, after its delay
        assert time.monotonic() - started >= DROP_DELAY_S * 0.9
        outbox.acked(4, 0, 0)
        assert outbox.pool_stats().session_held == 0 and outbox.pool_stats().leaked == 0
        outbox.disconnect("the test ends")

    asyncio.run(pull())
    close_and_check(engine)


def test_a_step_that_holds_a_turn_end_waits_whole_for_the_stores_take_and_no_longer():
    """A step whose turn end waits for its checkpoint goes on whole, the end with the step's
    other tokens, once the store takes the checkpoint: one dispatch, so one gateway item; if
    the store has not taken it within ``STEP_WAIT_S``, the other sessions' tokens go on without
    it and only the waiting session is held."""
    engine = make_engine()
    engine.open_session("s")
    run_turn(engine, "s", [5, 6, 7], greedy(3))
    record = engine.transfer.export([engine.sessions.get("s")])

    def step() -> StepOutputs:
        out = StepOutputs([TurnEvent("s", 1, (9,), "e", FinishReason.STOP, 7, gateway_id="g")])
        out.add_rows(["other"], [4], ["g"], [65], ["A"])
        return out

    def seen(sent: list) -> list[list[str]]:  # each dispatch's sessions, in order
        return [[e.session_id for out in outputs for e in out] for outputs in sent]

    async def pull() -> None:
        sent: list = []
        outbox = CheckpointOutbox(lambda outputs: sent.append(list(outputs)), capacity=4)
        stream = outbox.stream(False)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        outbox.push(CheckpointBatch(saved=[record]))
        outbox.dispatch([step()])
        assert await first == [record] and sent == []  # the whole step waits for the take
        taken = asyncio.ensure_future(stream.__anext__())  # the store takes it
        await asyncio.sleep(0)
        assert seen(sent) == [["s", "other"]]  # one dispatch: the end with the other's token
        outbox.push(CheckpointBatch(saved=[record]))  # the next turn's checkpoint
        outbox.dispatch([step()])
        assert await taken == [record] and len(sent) == 1
        await asyncio.sleep(STEP_WAIT_S * 4)  # the store is slow to take it
        assert seen(sent)[1:] == [["other"]]  # the other session is not held up
        resumed = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        assert seen(sent)[2:] == [["s"]]  # the held end, once the store has its checkpoint
        outbox.disconnect("the test ends")
        with pytest.raises(StopAsyncIteration):
            await resumed

    asyncio.run(pull())
    close_and_check(engine)
