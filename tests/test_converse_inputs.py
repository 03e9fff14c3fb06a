"""Converse inputs that arrive faster than turns start: merged in order, nothing dropped, and a
bounded amount pending (the reader waits beyond it)."""

from __future__ import annotations

import asyncio

from router.client import generate_request
from router.gateway.converse_inputs import (
    MAX_MERGED_TOKENS,
    MAX_PENDING,
    ClientHalfClosed,
    ClientInput,
    ClientInterrupt,
    PendingInputs,
    merge,
)


def test_merge_keeps_order_and_the_last_sampling():
    first = generate_request(tokens=[1, 2], max_new_tokens=3)
    then = generate_request(tokens=[3], max_new_tokens=9, temperature=0.5)
    merged = merge(first, then)
    assert list(merged.tokens.ids) == [1, 2, 3]
    assert merged.sampling.max_new_tokens == 9 and merged.sampling.temperature == 0.5
    assert merge(generate_request(text="ab"), generate_request(text="cd")).text == "abcd"
    assert merge(generate_request(text="ab"), then) is None  # text and tokens stay apart
    big = generate_request(tokens=[1] * MAX_MERGED_TOKENS)
    assert merge(big, then) is None  # past the bound: a new input


def test_pending_inputs_merge_runs_and_bound_what_waits():
    async def scenario() -> None:
        ready: list[int] = []
        pending = PendingInputs(lambda: ready.append(1))
        for n in range(100):
            await pending.put(ClientInput(generate_request(tokens=[n])))
        await pending.put(ClientInterrupt())
        await pending.put(ClientInput(generate_request(tokens=[100])))
        await pending.put(ClientHalfClosed())
        assert len(ready) == 1  # one wake-up for the whole burst
        items = pending.take()
        assert [type(i) for i in items] == [
            ClientInput,
            ClientInterrupt,
            ClientInput,
            ClientHalfClosed,
        ]
        assert list(items[0].request.tokens.ids) == list(range(100))

        for _ in range(MAX_PENDING):  # interrupts do not merge: the buffer fills
            await pending.put(ClientInterrupt())
        blocked = asyncio.ensure_future(pending.put(ClientInterrupt()))
        for _ in range(10):  # let it run as far as it can
            await asyncio.sleep(0)
        assert not blocked.done()  # the reader waits, so the client is slowed down
        assert len(pending.take()) == MAX_PENDING
        await asyncio.wait_for(blocked, 1)
        assert len(pending.take()) == 1

    asyncio.run(scenario())
