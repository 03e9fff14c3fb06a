"""Scale-out: more gateways in front of one cluster, and token delivery that follows the client.

``session-router gateway --address`` processes join a running serve: a session opened through one
gateway continues through any other, with the same state as a session that never changed gateway;
the SIGKILL of the gateway it was opened through loses nothing of it; the Converse streams of the
killed gateway end with it, and their sessions are released, an idle one's within seconds too
(nothing is streamed to that gateway when it dies: the replica's stream to it finds it gone at its
next empty item, long before the session's lease would lapse). A session opened (in one hop)
through a joined gateway is the router's like any other: a drain with migration moves it, and
every gateway, the joined one included, follows it to its new replica. A client that reads
slowly gets merged chunks (what the engine produced while it had not taken the last one), every
token in order."""

from __future__ import annotations

import queue
import time

import grpc
import pytest

from bench.harness.gateway_process import GatewayProcess
from protos import session_router_pb2 as pb
from replica.actor.gateway_outputs import HEARTBEAT_S
from router.client import SessionClient, generate_request
from router.gateway.stream_leases import LEASE_S
from tests.support.cluster import drain_stream, wait_for
from tests.support.servers import serve_cluster

PROMPTS = ([5, 6, 7], [8, 9], [10, 11, 12, 13])
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(replicas=1) as s:
        yield s


@pytest.fixture(scope="module")
def gateways(server):
    started = [GatewayProcess(server.config.namespace) for _ in range(2)]
    try:
        yield [g.start() for g in started]
    finally:
        for gateway in started:
            gateway.kill()


def open_requests(q: queue.Queue):
    yield pb.ConverseRequest(open=pb.OpenSessionRequest())
    while (item := q.get()) is not None:
        yield item


def turn(client: SessionClient, session_id: str, prompt: list[int]) -> tuple[list[int], int]:
    ids, reason, committed = drain_stream(
        client.generate(session_id, tokens=prompt, max_new_tokens=NEW_TOKENS, timeout=60)
    )
    assert reason == pb.FINISH_REASON_LENGTH
    return ids, committed


def committed_tokens(client: SessionClient, session_id: str) -> int:
    request = pb.GetSessionRequest(session_id=session_id)
    return client.sessions.GetSession(request, timeout=30).committed_tokens


def test_joined_gateways_print_where_they_listen_and_what_they_joined(server, gateways):
    for gateway in gateways:
        assert any("joined the cluster at" in line for line in gateway.lines), gateway.lines
        assert any(line.startswith("session-router: security:") for line in gateway.lines)


def test_a_session_continues_through_any_gateway_and_outlives_the_one_it_was_opened_through(
    server, gateways
):
    a, b = gateways
    with (
        SessionClient(a.address) as via_a,
        SessionClient(b.address) as via_b,
        SessionClient(server.address) as via_serve,
    ):
        reference = via_serve.open()  # the same turns, never changing gateway
        expected = [turn(via_serve, reference.id, prompt) for prompt in PROMPTS]
        reference.close()

        session = via_a.open()
        assert turn(via_a, session.id, PROMPTS[0]) == expected[0]
        assert turn(via_b, session.id, PROMPTS[1]) == expected[1]
        assert committed_tokens(via_serve, session.id) == expected[1][1]

        # a Converse through A, mid-turn when A dies
        q: queue.Queue = queue.Queue()
        stream = via_a.sessions.Converse(open_requests(q), timeout=60)
        opened = next(stream).opened
        q.put(pb.ConverseRequest(input=generate_request(tokens=[3, 4], max_new_tokens=400)))
        assert next(stream).chunk.token_ids
        a.kill()
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stream:
                pass
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        q.put(None)

        assert turn(via_b, session.id, PROMPTS[2]) == expected[2]
        assert committed_tokens(via_serve, session.id) == expected[2][1]
        wait_for(
            lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
            30,
            what="the killed gateway's Converse session to be released",
        )
        assert via_b.close_session(session.id)
    server.wait_at_capacity()


def test_an_idle_converse_of_a_killed_gateway_is_released_before_its_lease_lapses(server):
    gateway = GatewayProcess(server.config.namespace).start()
    try:
        with SessionClient(gateway.address) as client:
            q: queue.Queue = queue.Queue()
            stream = client.sessions.Converse(open_requests(q), timeout=60)
            opened = next(stream).opened
            assert opened.session_id in server.sessions_on()[opened.replica_id]
            time.sleep(2 * HEARTBEAT_S)  # idle: the replica's stream to it sends empty items
            gateway.kill()
            q.put(None)
            wait_for(
                lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
                LEASE_S / 2,
                what="the idle Converse session of the killed gateway to be released",
            )
    finally:
        gateway.kill()
    server.wait_at_capacity()


def test_a_joined_gateway_follows_its_sessions_through_a_drain_with_migration(server, gateways):
    b = gateways[1]
    (extra,) = server.start_replicas(1)
    with SessionClient(b.address) as via_b, SessionClient(server.address) as via_serve:
        wait_for(
            lambda: any(r.replica_id == extra and r.pools for r in via_serve.replicas()),
            30,
            0.1,
            "the new replica's first snapshot",
        )
        reference = via_serve.open()
        expected = [turn(via_serve, reference.id, prompt) for prompt in PROMPTS]
        reference.close()
        session = via_b.open()
        q: queue.Queue = queue.Queue()  # an idle Converse stream through B, across the move
        stream = via_b.sessions.Converse(open_requests(q), timeout=120)
        opened = next(stream).opened
        source = session.replica_id
        assert turn(via_b, session.id, PROMPTS[0]) == expected[0]

        reply = via_serve.drain(source, True, 60)
        assert reply.sessions_left == 0 and reply.sessions_migrated >= 1
        moved = via_serve.sessions.GetSession(pb.GetSessionRequest(session_id=session.id))
        assert moved.replica_id != source
        assert turn(via_b, session.id, PROMPTS[1]) == expected[1]  # B's cached route was stale
        assert turn(via_serve, session.id, PROMPTS[2]) == expected[2]
        q.put(pb.ConverseRequest(input=generate_request(tokens=[3, 4], max_new_tokens=4)))
        got, chunk = [], None
        for response in stream:  # the stream's first turn runs where its session is now
            chunk = response.chunk
            got += chunk.token_ids
            if chunk.finish_reason:
                break
        assert chunk.finish_reason == pb.FINISH_REASON_LENGTH and len(got) == 4
        q.put(None)
        assert list(stream) == []  # half-closed: the stream ends and releases its session
        assert via_b.close_session(session.id)
        via_serve.resume(source)
    wait_for(
        lambda: opened.session_id not in set().union(*server.sessions_on().values()),
        10,
        what="the Converse session to be released",
    )
    server.wait_at_capacity()


def test_a_slow_client_gets_merged_chunks_with_every_token_in_order(server):
    prompt, new = [7, 8, 9], 300
    with SessionClient(server.address) as client:
        with client.open() as reference:
            expected, expected_text, _ = reference.complete(tokens=prompt, max_new_tokens=new)
        with client.open() as session:
            ids, text, sizes = [], [], []
            for chunk in session.generate(tokens=prompt, max_new_tokens=new, timeout=120):
                ids.extend(chunk.token_ids)
                text.append(chunk.text)
                sizes.append(len(chunk.token_ids))
                time.sleep(0.03)  # a client that takes 30 ms over each message
    assert ids == expected and "".join(text) == expected_text
    assert len(sizes) < len(ids) and max(sizes) > 1, sizes
    server.wait_at_capacity()
