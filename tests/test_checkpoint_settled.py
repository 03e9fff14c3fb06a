"""A replica's ``checkpoints`` pool counts what its store acknowledged, so a released session's
last checkpoint and the drop after it are counted one acknowledgement apart: a snapshot read
between them (the store's count before the checkpoint: all free) is not the end state. The
snapshot says so (``CheckpointStats.unacked``), and ``PoolSnapshot.at_capacity`` holds only once
every entry is acknowledged. The engine is real (tiny-bamba) with its outbox connected; the
store's pull is made by hand, without Ray.
"""

from __future__ import annotations

import asyncio

from replica.checkpoints.entries import CheckpointDrop
from replica.checkpoints.outbox import CheckpointOutbox
from tests.support.engine import close_and_check, greedy, make_engine, run_turn


def test_the_pool_is_at_capacity_only_once_every_entry_is_acknowledged():
    engine = make_engine(session_checkpoints=True)
    outbox = CheckpointOutbox(lambda outputs: None, capacity=engine.config.pools.max_sessions)
    engine.checkpoint_accounting.connect(outbox)
    engine.checkpoints.enabled = True  # a store follows (as the replica's connection sets it)
    engine.open_session("s")
    run_turn(engine, "s", [5, 6, 7], greedy(3))
    batch = engine.session_ops.take_checkpoints()
    (record,) = batch.saved

    async def scenario() -> list[tuple[bool, int, int]]:
        seen = []

        def look() -> None:
            snap = engine.snapshot()
            pool = snap.pool("checkpoints")
            seen.append((snap.at_capacity, snap.checkpoints.unacked, pool.session_held))

        stream = outbox.stream(confirm_on_ack=False)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        outbox.push(batch)
        taken = await first
        assert taken[-1] == record
        engine.close_session("s")  # released before the store's acknowledgement came
        outbox.push(engine.session_ops.take_checkpoints())
        look()  # the store's last count: nothing held, yet entries are on their way
        outbox.acked(len(taken), 1, record.nbytes)  # the store counted the checkpoint
        look()
        assert await stream.__anext__() == [CheckpointDrop(("s",))]
        outbox.acked(len(taken) + 1, 0, 0)  # and the drop
        look()
        outbox.disconnect("the test ends")
        return seen

    before, *after = asyncio.run(scenario())
    # every pool free by the store's last count (a check of the pools alone passes here), yet
    # the checkpoint and its drop are on their way: not at capacity
    assert not before[0] and before[1] >= 2 and before[2] == 0
    assert after == [(False, 1, 1), (True, 0, 0)]
    close_and_check(engine)
