"""``CallBatcher``: requests go at once while fewer than ``max_in_flight`` calls are in flight,
and pile up into one call behind them otherwise; no request is ever left unsent."""

from __future__ import annotations

import asyncio

import pytest

from router.gateway.batching import CallBatcher


class Replica:
    """A send that answers each call when the test releases it, recording the batches."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gates: list[asyncio.Event] = []

    async def send(self, requests: list[int]) -> list[int]:
        self.batches.append(list(requests))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return [r * 10 for r in requests]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("in_flight", [1, 2])
def test_requests_wait_only_behind_max_in_flight_calls(in_flight: int) -> None:
    async def run() -> None:
        replica = Replica()
        batcher = CallBatcher(replica.send, in_flight)
        first = batcher.submit(1)
        await settle()
        second = batcher.submit(2)
        third = batcher.submit(3)
        await settle()
        if in_flight == 1:  # 2 and 3 wait for the first call, then go together
            assert replica.batches == [[1]]
        else:  # 2 goes at once in a second call; 3 waits behind the two
            assert replica.batches == [[1], [2, 3]]
        for gate in replica.gates:
            gate.set()
        await settle()
        while len(replica.gates) > len([g for g in replica.gates if g.is_set()]):
            for gate in replica.gates:
                gate.set()
            await settle()
        assert [await f for f in (first, second, third)] == [10, 20, 30]
        assert sorted(sum(replica.batches, [])) == [1, 2, 3]
        # the counts a benchmark reads the batch size from: calls made, requests carried
        assert (batcher.calls_sent, batcher.requests_sent) == (len(replica.batches), 3)

    asyncio.run(run())


def test_a_request_queued_as_a_sender_finishes_is_sent() -> None:
    """A request queued in the callback that settles the last call of a sender (its caller
    submits again at once) still goes: the sender counts as gone before any other code runs."""

    async def run() -> None:
        async def send(requests: list[int]) -> list[int]:
            await asyncio.sleep(0)
            return requests

        batcher = CallBatcher(send, 2)
        results = []
        for i in range(50):
            results.append(await asyncio.wait_for(batcher.call(i), 1.0))
        assert results == list(range(50))
        assert not batcher._senders

    asyncio.run(run())


def test_max_in_flight_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        CallBatcher(lambda requests: None, 0)
