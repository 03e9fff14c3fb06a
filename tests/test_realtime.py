"""The Realtime protocol (text) over a WebSocket with the official ``openai`` SDK's
``client.realtime.connect`` as the client, sync and async, on a chat checkpoint: every reply
equal to transformers' greedy ``generate`` on the token sequence the session holds (a chat
checkpoint whose replies run to their length) — after a
plain turn, after a cancel or a barge-in (the reference continued from the prompt plus exactly
the tokens ``response.done`` reported), after deleting the last exchange (an exact rollback) or
deleting further back (a replay) — every refused event answered with an ``error`` event on a
socket that stays usable, every session released when its socket closes, and a client past a
per-connection bound (a burst of unread events, or events it never reads the answers to)
dropped with 1008 alone, its session released."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode
from websockets.sync.client import connect as ws_connect

from router.http.realtime_outbox import MAX_OUTBOX_BYTES
from router.http.websocket_protocol import MAX_UNREAD_MESSAGES
from tests.support.chat_peer import long_reply_peer, prompt_ids
from tests.support.cluster import ServerThread, wait_for
from tests.support.hf_peer import hf_greedy
from tests.support.realtime_turns import (
    NEW,
    ask,
    continued,
    deltas,
    reference,
    replies_of_new_tokens,
    until_done,
    until_done_async,
    user,
)

KEY = "key-acme"
LONG = 200


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """``chat_peer``'s checkpoint with its EOS row zeroed: greedy replies never pick the EOS
    (its logit is 0, below the best of the others), so every response runs to its length and a
    long one can be cancelled part-way; the EOS stays the configured one."""
    return long_reply_peer(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ray_cluster, peer, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"{KEY} acme\n")
    server = ServerThread(
        model_path=peer[0], replicas=1, max_sessions=8, max_parked_sessions=16, max_context=1024,
        api_keys=str(keys),
    ).start()  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.server.front.http_url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def aclient(served):
    return openai.AsyncOpenAI(base_url=served.server.front.http_url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def long_prompt(peer):
    """A user message and its greedy reply of LONG tokens (no EOS on the way)."""
    _, hf, tok = peer
    text = "tell me a story"
    ids = prompt_ids(tok, [{"role": "user", "content": text}])
    out = hf_greedy(hf, ids, LONG, until_eos=True)
    assert len(out) == LONG
    return text, ids, out


def test_two_turns_equal_generate(client, model, peer):
    tok = peer[2]
    with client.realtime.connect(model=model) as conn:
        created = conn.recv()
        assert created.type == "session.created" and created.session.output_modalities == ["text"]
        session = {"type": "realtime", "instructions": "be brief", "output_modalities": ["text"],
                   "max_output_tokens": NEW}  # fmt: skip
        conn.session.update(session=session)
        updated = conn.recv()
        assert updated.type == "session.updated" and updated.session.max_output_tokens == NEW
        first = [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": "hello there"}]  # fmt: skip
        ids1 = prompt_ids(tok, first)
        out1, text1 = reference(peer, ids1)
        events, done = ask(conn, "hello there")
        kinds = [e.type for e in events]
        assert kinds[:2] == ["conversation.item.added", "conversation.item.done"]
        assert kinds[2:6] == ["response.created", "response.output_item.added",
                              "conversation.item.added", "response.content_part.added"]  # fmt: skip
        assert kinds[-5:] == ["response.output_text.done", "response.content_part.done",
                              "response.output_item.done", "conversation.item.done",
                              "response.done"]  # fmt: skip
        assert deltas(events) == text1 == done.output[0].content[0].text
        assert done.status == ("completed" if len(out1) < NEW else "incomplete")
        assert done.usage.output_tokens == len(out1)
        assert done.usage.input_tokens == len(ids1)
        # the second turn continues the held state: only the new part is fed
        state1 = ids1 + out1
        second = [*first, {"role": "assistant", "content": text1},
                  {"role": "user", "content": "and then?"}]  # fmt: skip
        fed2 = continued(peer, state1, second)
        out2, text2 = reference(peer, state1 + fed2)
        events, done = ask(conn, "and then?")
        assert deltas(events) == text2
        assert done.usage.output_tokens == len(out2)
        assert done.usage.input_token_details.cached_tokens == len(state1)
        assert done.usage.input_tokens == len(state1) + len(fed2)


def test_a_cancelled_response_keeps_exactly_its_tokens(aclient, model, peer, long_prompt):
    """Cancelled after its first deltas: the state holds the prompt and exactly the tokens
    response.done reports; the next turn equals the reference continued from there."""
    text, ids, out = long_prompt
    tok = peer[2]

    async def run():
        async with aclient.realtime.connect(model=model) as conn:
            assert (await conn.recv()).type == "session.created"
            await conn.session.update(session={"type": "realtime", "max_output_tokens": LONG})
            await conn.conversation.item.create(item=user(text))
            await conn.response.create()
            seen = 0
            async for event in conn:
                seen += event.type == "response.output_text.delta"
                if seen == 2:
                    break
            await conn.response.cancel()
            events, done = await until_done_async(conn)
            assert done.status == "cancelled"
            assert done.status_details.reason == "client_cancelled"
            cut = done.usage.output_tokens
            assert 0 < cut < LONG
            got = done.output[0].content[0].text
            assert got == tok.decode(out[:cut], skip_special_tokens=True)
            state = ids + out[:cut]
            messages = [{"role": "user", "content": text}, {"role": "assistant", "content": got},
                        {"role": "user", "content": "ok"}]  # fmt: skip
            fed = continued(peer, state, messages)
            _, expected = reference(peer, state + fed)
            await conn.conversation.item.create(item=user("ok"))
            await conn.response.create(response={"max_output_tokens": NEW})
            events, done = await until_done_async(conn)
            assert deltas(events) == expected
            assert done.usage.input_token_details.cached_tokens == len(state)
            # a response.cancel with nothing running is an error; the socket goes on
            await conn.response.cancel()
            error = await conn.recv()
            assert error.type == "error" and error.error.code == "response_cancel_not_active"

    asyncio.run(run())


def test_barge_in_with_a_new_response(client, model, peer, long_prompt):
    """A response.create while one runs: that one ends cancelled at its tokens, the new one
    continues the state exactly (the cut assistant message closed the template's way)."""
    text, ids, out = long_prompt
    tok = peer[2]
    with client.realtime.connect(model=model) as conn:
        conn.recv()
        conn.conversation.item.create(item=user(text))
        conn.response.create(response={"max_output_tokens": LONG})
        for event in conn:
            if event.type == "response.output_text.delta":
                break
        conn.response.create(response={"max_output_tokens": NEW})
        _, cancelled = until_done(conn)
        assert cancelled.status == "cancelled"
        cut = cancelled.usage.output_tokens
        got = cancelled.output[0].content[0].text
        assert 0 < cut < LONG and got == tok.decode(out[:cut], skip_special_tokens=True)
        state = ids + out[:cut]
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": got}]
        fed = continued(peer, state, messages)
        expected_ids, expected = reference(peer, state + fed)
        events, done = until_done(conn)
        assert deltas(events) == expected and done.usage.output_tokens == len(expected_ids)
        assert done.usage.input_token_details.cached_tokens == len(state)


def test_deleting_the_last_exchange_rolls_back_exactly(client, model, peer):
    tok = peer[2]
    with client.realtime.connect(model=model) as conn:
        replies_of_new_tokens(conn)
        first = [{"role": "user", "content": "hello there"}]
        ids1 = prompt_ids(tok, first)
        out1, text1 = reference(peer, ids1)
        _, done1 = ask(conn, "hello there")
        state1 = ids1 + out1
        second = [*first, {"role": "assistant", "content": text1},
                  {"role": "user", "content": "and then?"}]  # fmt: skip
        fed2 = continued(peer, state1, second)
        _, text2 = reference(peer, state1 + fed2)
        events, done2 = ask(conn, "and then?")
        assert deltas(events) == text2
        user2 = next(e.item.id for e in events if e.type == "conversation.item.added")
        # delete the reply: the fork taken before it is the state again, the same reply follows
        conn.conversation.item.delete(item_id=done2.output[0].id)
        assert conn.recv().type == "conversation.item.deleted"
        conn.response.create()
        events, again = until_done(conn)
        assert deltas(events) == text2
        assert again.usage.input_token_details.cached_tokens == len(state1)
        # delete that reply and its question: another question continues state1 exactly
        conn.conversation.item.delete(item_id=again.output[0].id)
        conn.conversation.item.delete(item_id=user2)
        assert [conn.recv().type for _ in range(2)] == ["conversation.item.deleted"] * 2
        third = [*first, {"role": "assistant", "content": text1},
                 {"role": "user", "content": "merci"}]  # fmt: skip
        fed3 = continued(peer, state1, third)
        _, text3 = reference(peer, state1 + fed3)
        events, done3 = ask(conn, "merci")
        assert deltas(events) == text3
        assert done3.usage.input_token_details.cached_tokens == len(state1)
        # deleting further back than the last response replays the rest into a fresh session
        for item_id in (done3.output[0].id, events[0].item.id, done1.output[0].id):
            conn.conversation.item.delete(item_id=item_id)
            assert conn.recv().type == "conversation.item.deleted"
        conn.response.create()
        events, replayed = until_done(conn)
        assert deltas(events) == text1
        assert replayed.usage.input_token_details.cached_tokens == 0
        assert replayed.usage.input_tokens == len(ids1)


REFUSED = [
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {}}}},
     "session.audio"),
    ({"type": "session.update", "session": {"type": "realtime", "tools": [
        {"type": "function", "name": "f"}]}}, "session.tools"),
    ({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}},
     "session.output_modalities"),
    ({"type": "session.update", "session": {"type": "transcription"}}, "session.type"),
    ({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 0}},
     "session.max_output_tokens"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
      "content": [{"type": "input_audio", "audio": "AAAA"}]}}, "item.content[0]"),
    ({"type": "conversation.item.create", "item": {"type": "function_call_output",
      "call_id": "c", "output": "x"}}, "item.call_id"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "assistant",
      "content": [{"type": "input_text", "text": "x"}]}}, "item.content[0]"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "developer",
      "content": [{"type": "input_text", "text": "x"}]}}, "item.role"),
    ({"type": "conversation.item.create", "previous_item_id": "nope", "item": user("x")},
     "previous_item_id"),
    ({"type": "conversation.item.delete", "item_id": "nope"}, "item_id"),
    ({"type": "conversation.item.retrieve", "item_id": "nope"}, "item_id"),
    ({"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0,
      "audio_end_ms": 0}, "item_id"),
    ({"type": "input_audio_buffer.append", "audio": "AAAA"}, "type"),
    ({"type": "response.create", "response": {"tools": [{"type": "function", "name": "f"}]}},
     "response.tools"),
    ({"type": "response.create", "response": {"output_modalities": ["audio"]}},
     "response.output_modalities"),
    ({"type": "response.cancel"}, "response_id"),
]  # fmt: skip


def test_every_refused_event_is_an_error_and_the_socket_goes_on(client, model, peer):
    with client.realtime.connect(model=model) as conn:
        conn.recv()
        for i, (event, param) in enumerate(REFUSED):
            conn.send_raw(json.dumps({**event, "event_id": f"evt_{i}"}))
            error = conn.recv()
            assert error.type == "error", event
            assert error.error.event_id == f"evt_{i}" and error.error.param == param, error
        conn.send_raw("{not json")
        assert conn.recv().type == "error"
        # only the last item can be deleted; a retrieve gives the item back
        conn.conversation.item.create(item=user("hello"))
        first = conn.recv().item.id
        conn.recv()
        conn.conversation.item.create(item=user("there"))
        conn.recv(), conn.recv()
        conn.send_raw(json.dumps({"type": "conversation.item.delete", "item_id": first,
                                  "event_id": "evt_del"}))  # fmt: skip
        error = conn.recv()
        assert error.type == "error" and error.error.event_id == "evt_del"
        conn.conversation.item.retrieve(item_id=first)
        retrieved = conn.recv()
        assert retrieved.type == "conversation.item.retrieved"
        assert retrieved.item.content[0].text == "hello"
        # the session was never touched by the refusals: a response is exact
        messages = [{"role": "user", "content": "hello"}, {"role": "user", "content": "there"}]
        _, expected = reference(peer, prompt_ids(peer[2], messages))
        conn.response.create(response={"max_output_tokens": NEW})
        events, done = until_done(conn)
        assert deltas(events) == expected and done.status in ("completed", "incomplete")


def test_keys_and_the_browser_subprotocol(served, model):
    url = served.server.front.http_url.replace("http://", "ws://") + f"/realtime?model={model}"
    with ws_connect(url, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(ws.recv())["type"] == "session.created"
    nobody = openai.OpenAI(base_url=served.server.front.http_url, api_key="wrong", max_retries=0)
    with pytest.raises(Exception) as refused:
        with nobody.realtime.connect(model=model) as conn:
            conn.recv()
    assert "401" in str(refused.value)
    with pytest.raises(Exception) as refused:
        with ws_connect(url.replace(model, "gpt-nope"),
                        additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:  # fmt: skip
            ws.recv()
    assert "404" in str(refused.value)


def metric(served, series: str) -> float:
    text = httpx.get(served.server.metrics_url).text
    values = [line for line in text.splitlines() if line.startswith(series)]
    return float(values[0].split()[-1]) if values else 0.0


def realtime_socket(served, model, **options):
    url = served.server.front.http_url.replace("http://", "ws://") + f"/realtime?model={model}"
    return ws_connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, **options)


def close_code_after_reading(ws) -> int | None:
    """Read everything the server sent until the socket ends; the close code it sent."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=30)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


def released(served, drops_before: float) -> None:
    """The server counted one more drop with 1008, and the connection's sessions are gone."""
    wait_for(lambda: metric(served, 'session_router_realtime_dropped_total{code="1008"}')
             > drops_before, 30, 0.2, "the drop to be counted")  # fmt: skip
    wait_for(lambda: metric(served, "session_router_realtime_sessions") == 0, 30, 0.2,
             "the connection to end")  # fmt: skip
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)


def test_a_burst_past_the_unread_bound_is_dropped_with_1008(served, model):
    """More client events at once than the server lets wait unread (MAX_UNREAD_MESSAGES, in
    one write: the server reads them together): closed with 1008, the session released."""
    drops = metric(served, 'session_router_realtime_dropped_total{code="1008"}')
    with realtime_socket(served, model) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        frame = Frame(Opcode.TEXT, b'{"type": "no.such.event"}').serialize(mask=True)
        ws.socket.sendall(frame * (4 * MAX_UNREAD_MESSAGES))
        assert close_code_after_reading(ws) == 1008
    released(served, drops)


def test_a_client_that_never_reads_is_dropped_with_1008(served, model):
    """A client that floods events and never reads the answers (an error event each, of about
    2 kB): once more than MAX_OUTBOX_BYTES of them wait to be written past what the socket
    buffers hold, the server drops it with 1008 (not the keepalive's 1011: that takes a minute
    here) and releases its session; what was queued for it is freed."""
    drops = metric(served, 'session_router_realtime_dropped_total{code="1008"}')
    event = json.dumps({"type": "x" * 2000})  # answered by an error naming the type
    sent = 0
    with realtime_socket(served, model, max_queue=4) as ws:
        deadline = time.monotonic() + 60
        while metric(served, 'session_router_realtime_dropped_total{code="1008"}') == drops:
            assert time.monotonic() < deadline, f"not dropped after {sent} events"
            for _ in range(200):
                ws.send(event)
            sent += 200
        assert sent * len(event) > MAX_OUTBOX_BYTES
        assert close_code_after_reading(ws) == 1008
    released(served, drops)


def test_closing_the_socket_releases_the_session(served, client, model, long_prompt):
    """A socket closed mid-response: its turn, its session and its checkpoint are released;
    the pools are back at capacity with nothing leaked; the metrics counted it all."""
    with client.realtime.connect(model=model) as conn:
        conn.recv()
        conn.conversation.item.create(item=user(long_prompt[0]))
        conn.response.create(response={"max_output_tokens": LONG})
        for event in conn:
            if event.type == "response.output_text.delta":
                break
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)
    text = httpx.get(served.server.metrics_url).text
    assert "session_router_realtime_sessions 0.0" in text
    for series in ('session_router_realtime_responses_total{status="cancelled"}',
                   'session_router_realtime_responses_total{status="incomplete"}',
                   "session_router_realtime_cancels_total"):  # fmt: skip
        values = [line for line in text.splitlines() if line.startswith(series)]
        assert values and float(values[0].split()[-1]) > 0, series
