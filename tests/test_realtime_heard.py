"""Keeping only what the user heard of a cut reply, through the ``openai`` SDK's
``realtime.connect``: a long response cancelled part-way, its reply deleted (the state rolls
back to the fork taken before that response), an assistant message of a prefix of its text
created, then a new response. Its reply equals transformers' greedy continuation of exactly the
chat template's rendering of the conversation with the heard prefix as the assistant message,
fed past the rolled-back state (``cached_tokens``: that state, no replay); the turn after it
continues the state exactly, so only the heard part entered it. ``conversation.item.truncate``
(audio only in the API) is answered with an ``error`` event that says how, and the socket goes
on. Pools at capacity with nothing leaked once the socket closes."""

from __future__ import annotations

import time

import openai
import pytest

from tests.support.chat_peer import long_reply_peer
from tests.support.cluster import ServerThread
from tests.support.realtime_turns import (
    ask,
    continued,
    deltas,
    first_exchange,
    reference,
    until_done,
    user,
)
from tests.support.servers import grpc_client

LONG = 200
STORY = "tell me a story"
IDLE_S = 2.0  # the server's idle timeout: a live socket's sessions must outlive it


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """A chat checkpoint whose greedy replies never reach the EOS: a long one can be cut."""
    return long_reply_peer(tmp_path_factory)


@pytest.fixture(scope="module")
def served(ray_cluster, peer):
    server = ServerThread(
        model_path=peer[0], replicas=1, max_sessions=8, max_parked_sessions=16, max_context=1024,
        session_idle_timeout_s=IDLE_S,
    ).start()  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.server.front.http_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def assistant(text: str) -> dict:
    """An assistant message as the GA API creates one (``output_text`` parts)."""
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}  # fmt: skip


def cut_reply(conn, text: str) -> object:
    """Ask ``text`` with a long response, cancelled after its second delta; its response."""
    conn.conversation.item.create(item=user(text))
    conn.response.create(response={"max_output_tokens": LONG})
    seen = 0
    for event in conn:
        seen += event.type == "response.output_text.delta"
        if seen == 2:
            break
    conn.response.cancel()
    _, done = until_done(conn)
    assert done.status == "cancelled" and 0 < done.usage.output_tokens < LONG
    return done


def test_only_the_heard_part_of_a_cut_reply_enters_the_state(served, client, model, peer):
    with client.realtime.connect(model=model) as conn:
        first, state1, text1 = first_exchange(conn, peer)
        cut = cut_reply(conn, STORY)
        produced = cut.output[0].content[0].text
        heard = produced[: len(produced) // 2]
        assert 0 < len(heard) < len(produced)
        # the client played only ``heard``: it deletes the reply and says what was heard
        conn.conversation.item.delete(item_id=cut.output[0].id)
        assert conn.recv().type == "conversation.item.deleted"
        conn.conversation.item.create(item=assistant(heard))
        added, done = conn.recv(), conn.recv()
        assert (added.type, done.type) == ("conversation.item.added", "conversation.item.done")
        assert done.item.role == "assistant" and done.item.status == "completed"
        assert done.item.content[0].type == "output_text" and done.item.content[0].text == heard
        messages = [*first, {"role": "assistant", "content": text1},
                    {"role": "user", "content": STORY}, {"role": "assistant", "content": heard},
                    {"role": "user", "content": "go on"}]  # fmt: skip
        fed = continued(peer, state1, messages)
        out3, text3 = reference(peer, state1 + fed)
        events, done3 = ask(conn, "go on")
        assert deltas(events) == text3 and done3.usage.output_tokens == len(out3)
        assert done3.usage.input_token_details.cached_tokens == len(state1)
        assert done3.usage.input_tokens == len(state1) + len(fed)
        # a truncate (audio only) is refused, saying how; the socket and the state go on
        conn.conversation.item.truncate(item_id=done3.output[0].id, content_index=0,
                                        audio_end_ms=1200, event_id="evt_cut")  # fmt: skip
        error = conn.recv()
        assert error.type == "error" and error.error.event_id == "evt_cut"
        assert error.error.param == "audio_end_ms"
        assert error.error.code == "unsupported_content_type"
        assert "conversation.item.delete" in error.error.message
        assert "conversation.item.create" in error.error.message
        user_item = next(e.item.id for e in events if e.type == "conversation.item.added")
        conn.conversation.item.truncate(item_id=user_item, content_index=0, audio_end_ms=0)
        error = conn.recv()
        assert error.type == "error" and error.error.param == "item_id"
        state3 = state1 + fed + out3
        messages = [*messages, {"role": "assistant", "content": text3},
                    {"role": "user", "content": "thanks"}]  # fmt: skip
        fed4 = continued(peer, state3, messages)
        _, text4 = reference(peer, state3 + fed4)
        events, done4 = ask(conn, "thanks")
        assert deltas(events) == text4
        assert done4.usage.input_token_details.cached_tokens == len(state3)
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)


def test_an_open_socket_outlives_the_idle_timeout(served, client, model, peer):
    """The idle timeout ends a session nobody holds (a gRPC one, opened beside), never a live
    socket's: after three idle timeouts the socket's next response continues its state."""
    with grpc_client(served.address) as grpc_c:
        unheld = grpc_c.open(timeout=30)
        with client.realtime.connect(model=model) as conn:
            first, state1, text1 = first_exchange(conn, peer)
            time.sleep(3 * IDLE_S)
            assert grpc_c.close_session(unheld.id) is False, "the idle timeout did not apply"
            second = [*first, {"role": "assistant", "content": text1},
                      {"role": "user", "content": "and then?"}]  # fmt: skip
            fed = continued(peer, state1, second)
            _, text2 = reference(peer, state1 + fed)
            events, done = ask(conn, "and then?")
            assert deltas(events) == text2
            assert done.usage.input_token_details.cached_tokens == len(state1)
    served.wait_at_capacity(timeout=30)
    served.assert_no_leaks(at_capacity=True)
