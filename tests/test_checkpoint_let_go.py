"""A session whose committed state no connected checkpoint store holds is reported ``let_go``
(``CheckpointStats.let_go``, read by a failover's ``BlankReopen``): one whose turn ended while no
store followed the replica, and every session the store held when it went (a store that follows
again starts from nothing), until a checkpoint of it is stored again or it is released. A
failover then never opens it again empty, which would lose a turn its client saw end. The
engine is real (tiny-bamba); the outbox runs without Ray, its store's pull made by hand.
"""

from __future__ import annotations

import asyncio

from replica.checkpoints.log import CheckpointBatch
from replica.checkpoints.outbox import CheckpointOutbox
from tests.support.engine import close_and_check, greedy, make_engine, run_turn


def test_a_turn_ended_while_no_store_follows_is_reported_unsaved_by_the_engine():
    engine = make_engine(session_checkpoints=True)
    for sid in ("turned", "empty"):
        engine.open_session(sid)
    run_turn(engine, "turned", [5, 6, 7], greedy(3))  # no store follows: nothing exported
    batch = engine.session_ops.take_checkpoints()
    assert batch.saved == [] and batch.unsaved == ["turned"]  # "empty" holds nothing to lose
    assert not engine.session_ops.take_checkpoints()  # reported once
    close_and_check(engine)


def test_let_go_names_what_no_connected_store_holds_until_it_is_stored_again():
    engine = make_engine(session_checkpoints=True)
    engine.open_session("s")
    run_turn(engine, "s", [5, 6, 7], greedy(3))
    record = engine.transfer.export([engine.sessions.get("s")])

    def let_go(outbox: CheckpointOutbox) -> frozenset[str]:
        return outbox.stats(["s", "t"]).let_go

    async def scenario() -> list[frozenset[str]]:
        outbox = CheckpointOutbox(lambda outputs: None, capacity=4)
        seen = []
        for round_ in range(2):  # a store follows, takes s's checkpoint, then goes
            stream = outbox.stream(confirm_on_ack=False)
            first = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0)
            outbox.push(CheckpointBatch(saved=[record]))
            assert await first == [record]
            taken = asyncio.ensure_future(stream.__anext__())  # the store has it: stored
            await asyncio.sleep(0)
            seen.append(let_go(outbox))
            outbox.disconnect("the store died")
            await asyncio.gather(taken, return_exceptions=True)
            seen.append(let_go(outbox))
            if round_ == 0:  # t's turn ends while no store follows
                outbox.push(CheckpointBatch(unsaved=["t"]))
                seen.append(let_go(outbox))
        outbox.push(CheckpointBatch(released=["s", "t"]))
        seen.append(let_go(outbox))
        return seen

    assert asyncio.run(scenario()) == [
        frozenset(),  # s stored
        {"s"},  # its store went
        {"s", "t"},  # t changed with none following
        {"t"},  # s stored in the next store; t has no checkpoint yet
        {"s", "t"},  # that store went too
        frozenset(),  # both released
    ]
    close_and_check(engine)
