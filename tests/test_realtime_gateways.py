"""Realtime sockets on two ``session-router gateway`` processes joined to one serve: the SIGKILL
of one gateway ends its sockets and releases their sessions (and their rollback forks) within
the stream lease, while the sockets on the other gateway go on exactly: every reply after the
kill equals transformers' greedy continuation of the tokens that session held before it. And a
socket whose peer answers no ping is dropped by the keepalive (``--keepalive-s``) with 1011."""

from __future__ import annotations

import json
import time

import openai
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from bench.harness.gateway_process import GatewayProcess
from router.gateway.stream_leases import LEASE_S
from tests.support.chat_peer import long_reply_peer, prompt_ids
from tests.support.cluster import wait_for
from tests.support.realtime_turns import ask, continued, deltas, reference, user
from tests.support.servers import serve_cluster

LONG = 300
PING_S = 5  # the second gateway's keepalive: it pings every 5 s, and drops after 5 s more


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return long_reply_peer(tmp_path_factory)


@pytest.fixture(scope="module")
def server(ray_cluster, peer):
    with serve_cluster(model_path=peer[0], replicas=1, max_sessions=12, max_context=1024) as s:
        yield s


@pytest.fixture(scope="module")
def gateways(server):
    namespace = server.config.namespace
    started = [GatewayProcess(namespace), GatewayProcess(namespace, "--keepalive-s", str(PING_S))]
    try:
        yield [g.start() for g in started]
    finally:
        for gateway in started:
            gateway.kill()


def sessions(server) -> set[str]:
    return set().union(*server.sessions_on().values())


class Socket:
    """One Realtime connection through a gateway, and the conversation it has had: its
    messages and the token ids its session holds (the reference's view)."""

    def __init__(self, gateway: GatewayProcess, peer, question: str) -> None:
        client = openai.OpenAI(base_url=gateway.http_url, api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        self.manager = client.realtime.connect(model=model)
        self.conn = self.manager.enter()
        assert self.conn.recv().type == "session.created"
        self.conn.session.update(session={"type": "realtime", "max_output_tokens": 8})
        assert self.conn.recv().type == "session.updated"
        self.peer, self.messages, self.state = peer, [], []
        self.turn(question)

    def turn(self, question: str) -> None:
        """A question and its reply, checked against the reference continued from the state."""
        self.messages.append({"role": "user", "content": question})
        if self.state:
            fed = continued(self.peer, self.state, self.messages)
        else:
            fed = prompt_ids(self.peer[2], self.messages)
        out, text = reference(self.peer, self.state + fed)
        events, done = ask(self.conn, question)
        assert deltas(events) == text and done.usage.output_tokens == len(out)
        assert done.usage.input_token_details.cached_tokens == len(self.state)
        self.messages.append({"role": "assistant", "content": text})
        self.state += fed + out

    def close(self) -> None:
        self.manager.__exit__(None, None, None)


def test_a_killed_gateway_loses_no_session_of_the_other(server, gateways, peer):
    a, b = gateways
    on_b = [Socket(b, peer, f"hello from b{i}") for i in range(2)]
    held_by_b = sessions(server)  # each socket's session and the fork of its last response
    assert len(held_by_b) == 4
    on_a = [Socket(a, peer, f"hello from a{i}") for i in range(2)]
    assert len(sessions(server)) == 8
    # one of A's sockets is mid-response when A dies
    streaming = on_a[0].conn
    streaming.conversation.item.create(item=user("tell me a story"))
    streaming.response.create(response={"max_output_tokens": LONG})
    for event in streaming:
        if event.type == "response.output_text.delta":
            break
    a.kill()
    for socket in on_a:  # A's sockets end: the peer is gone without a close frame
        with pytest.raises(ConnectionClosed):
            while True:
                socket.conn.recv()
    wait_for(lambda: sessions(server) == held_by_b, LEASE_S, 0.5,
             "the killed gateway's sessions and forks to be released")  # fmt: skip
    # B's sockets go on from exactly the state they held
    for i, socket in enumerate(on_b):
        socket.turn(f"and then {i}?")
        socket.turn("thanks")
    for socket in on_b:
        socket.close()
    server.wait_at_capacity(timeout=30)
    server.assert_no_leaks(at_capacity=True)


def test_a_socket_that_answers_no_ping_is_dropped_with_1011(server, gateways):
    """A peer that stops reading (its client takes in one message and reads no more until that
    one is taken, so no pong goes back): dropped with 1011 one keepalive after the unanswered
    ping, its session released."""
    url = gateways[1].http_url.replace("http", "ws", 1) + "/realtime"
    with ws_connect(url, max_queue=0) as ws:
        opened = time.monotonic()
        wait_for(lambda: len(sessions(server)) == 1, 30, 0.2, "the socket's session")
        time.sleep(max(0.0, opened + 2 * PING_S + 3 - time.monotonic()))
        assert json.loads(ws.recv(timeout=10))["type"] == "session.created"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    server.wait_at_capacity(timeout=30)
    server.assert_no_leaks(at_capacity=True)
