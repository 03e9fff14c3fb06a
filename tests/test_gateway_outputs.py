"""The replica's outboxes for its gateways' output streams, read by a plain generator on a thread
of its own or by an async generator on the event loop: a waiting stream wakes at once with what
was dispatched, merged; on a thread, with nothing to send it yields an empty item every
``HEARTBEAT_S`` (Ray ends a gone caller's plain generator at a ``yield``); a stream that ends calls
``on_gone`` for its gateway once, and its outputs are dropped until it streams again; a newer
stream of a gateway takes over the entries still waiting and the older one ends without them.
The threads are handed out one per stream and given back at its end (``StreamThreads``)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import pytest

from replica.actor.gateway_outputs import HEARTBEAT_S, GatewayOutputs, ReplicaFailedError
from replica.actor.stream_threads import StreamThreads, concurrency_groups
from replica.engine.step_outputs import StepOutputs


def rows(gateway: str, tokens: list[int]) -> StepOutputs:
    step = StepOutputs()
    n = len(tokens)
    step.add_rows([f"s{i}" for i in range(n)], [1] * n, [gateway] * n, tokens, ["x"] * n)
    return step


def test_a_stream_on_a_thread_wakes_with_what_the_loop_dispatched():
    outputs = GatewayOutputs()
    stream = outputs.stream("g")
    got: list = []
    reader = threading.Thread(target=lambda: got.append((next(stream), time.monotonic())))
    reader.start()
    time.sleep(0.2)  # the stream waits for an entry
    sent_at = time.monotonic()
    outputs.dispatch([rows("g", [5, 6]), rows("other", [9]), rows("g", [7])])
    reader.join(5)
    ((item, at),) = got
    assert item == [(["s0", "s1", "s0"], [1, 1, 1], [5, 6, 7], ["x", "x", "x"])]
    assert at - sent_at < HEARTBEAT_S / 2  # woken, not found at its heartbeat
    stream.close()


def test_a_waiting_stream_sleeps_through_other_gateways_outputs(monkeypatch):
    """Each outbox's stream waits on a condition of its own: what is dispatched to one gateway
    wakes that gateway's stream only, not every idle one (a replica holds a stream for each
    gateway that ever used it)."""
    waits: collections.Counter[str] = collections.Counter()
    real_wait = threading.Condition.wait

    def counting_wait(self, timeout=None):
        waits[threading.current_thread().name] += 1
        return real_wait(self, timeout)

    monkeypatch.setattr(threading.Condition, "wait", counting_wait)
    outputs = GatewayOutputs()
    idle = outputs.stream("idle")
    got: list = []
    reader = threading.Thread(target=lambda: got.append(next(idle)), name="idle-reader")
    reader.start()
    busy = outputs.stream("busy")
    tokens: list[int] = []
    busy_reader = threading.Thread(
        target=lambda: [tokens.extend(next(busy)[0][2]) for _ in range(20)], name="busy-reader"
    )
    busy_reader.start()
    time.sleep(0.1)  # both wait for an entry
    for token in range(20):
        outputs.dispatch([rows("busy", [token])])
        time.sleep(0.005)  # the busy stream takes it and waits again
    busy_reader.join(5)
    reader.join(5)
    assert tokens == list(range(20)) and waits["busy-reader"] >= 20  # woken for each
    assert got == [[]]  # the idle one's heartbeat: nothing came for it
    assert waits["idle-reader"] == 1  # and nothing woke it before
    idle.close()
    busy.close()


def test_a_stream_on_the_loop_wakes_with_what_was_dispatched():
    async def run() -> list:
        outputs = GatewayOutputs()
        stream = outputs.stream_async("g")
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        assert not first.done()  # it waits: nothing for it yet (and no empty item)
        outputs.dispatch([rows("other", [9]), rows("g", [5])])
        item = await asyncio.wait_for(first, 5)
        await stream.aclose()
        return item

    assert asyncio.run(run()) == [(["s0"], [1], [5], ["x"])]


def test_an_idle_stream_on_a_thread_yields_an_empty_item_every_heartbeat():
    outputs = GatewayOutputs()
    stream = outputs.stream("g")
    t0 = time.monotonic()
    assert next(stream) == []
    assert HEARTBEAT_S * 0.9 <= time.monotonic() - t0 < HEARTBEAT_S * 3
    outputs.dispatch([rows("g", [3])])
    assert next(stream)[0][2] == [3]
    stream.close()


def test_an_ended_stream_calls_on_gone_once_and_its_outputs_are_dropped_until_it_streams():
    gone: list[str] = []
    outputs = GatewayOutputs(on_gone=gone.append)
    stream = outputs.stream("g")
    outputs.dispatch([rows("g", [1])])
    assert next(stream)[0][2] == [1]
    stream.close()  # what Ray does to the generator of a caller that is gone
    assert gone == ["g"]
    outputs.dispatch([rows("g", [2])])  # dropped: no reader
    outputs.close()
    assert list(outputs.stream("g")) == []
    assert gone == ["g"]  # a stream ended by the replica's close is not a gateway gone


def test_a_newer_stream_takes_over_the_waiting_entries_and_the_older_ends_without_them():
    gone: list[str] = []
    outputs = GatewayOutputs(on_gone=gone.append)
    older = outputs.stream("g")
    outputs.dispatch([rows("g", [1])])
    assert next(older)[0][2] == [1]
    outputs.dispatch([rows("g", [2])])  # the older stream has not taken it when the newer starts
    newer = outputs.stream("g")
    assert next(newer)[0][2] == [2]
    outputs.dispatch([rows("g", [3])])
    assert list(older) == []  # ended at once, its thread free; the entries are the newer one's
    assert next(newer)[0][2] == [3]
    assert gone == []  # the gateway streams on through the newer one
    outputs.fail("the engine died")
    with pytest.raises(ReplicaFailedError, match="the engine died"):
        next(newer)
    assert gone == []  # the replica failed: not a gateway gone


def test_stream_threads_are_handed_out_once_each_and_given_back():
    threads = StreamThreads(2)
    first, second = threads.reserve("a"), threads.reserve("b")
    assert {first, second} == set(concurrency_groups(2))
    assert threads.reserve("c") == ""  # none free: that gateway streams from the event loop
    threads.release(first, "a")
    threads.release(first, "a")  # idempotent
    assert threads.held() == {second: "b"}
    assert threads.reserve("c") == first


def test_a_thread_reserved_and_never_streamed_on_is_free_again_after_its_bound():
    now = [0.0]
    threads = StreamThreads(1, reserved_s=10.0, clock=lambda: now[0])
    group = threads.reserve("dead")  # its gateway dies before its stream call
    now[0] = 9.0
    assert threads.reserve("b") == ""
    now[0] = 11.0
    assert threads.reserve("b") == group  # given up: it is b's now
    threads.started(group, "dead")  # a late stream of the dead gateway takes nothing
    threads.release(group, "dead")  # nor gives b's group back
    threads.started(group, "b")
    now[0] = 100.0
    assert threads.reserve("c") == ""  # b streams on it: no bound
    threads.release(group, "b")
    assert threads.reserve("c") == group
