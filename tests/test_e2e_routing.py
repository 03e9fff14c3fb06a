"""End to end: sessions stick to their replica, turns continue from saved state, Converse
barge-in and client cancels, and OpenSession waiting for room on full replicas.

A real ``Server`` (local Ray, two tiny-bamba replicas, loopback gRPC) is shared by the module.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient, generate_request
from tests.support.cluster import ServerThread, drain_stream, rpc_error, wait_for

OPEN_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def server(ray_cluster):
    srv = ServerThread(open_timeout_s=OPEN_TIMEOUT_S).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with SessionClient(server.address) as c:
        yield c


def tokens(seed: int, n: int = 8) -> list[int]:
    return [(seed * 31 + i * 7) % 250 + 1 for i in range(n)]


def open_requests(q: queue.Queue):
    """A Converse request iterator: ``open`` first, then whatever is put on ``q`` (None ends)."""
    yield pb.ConverseRequest(open=pb.OpenSessionRequest())
    while (item := q.get()) is not None:
        yield item


def test_every_turn_runs_on_the_pinned_replica(server, client):
    sessions = [client.open() for _ in range(6)]
    placed = {s.replica_id for s in sessions}
    assert placed == set(server.replicas), f"sessions not spread over both replicas: {placed}"
    for turn in range(3):
        for n, s in enumerate(sessions):
            ids, reason, committed = drain_stream(
                s.generate(tokens=tokens(n + turn), max_new_tokens=4)
            )
            assert len(ids) == 4 and reason == pb.FINISH_REASON_LENGTH
            held = server.sessions_on()
            assert s.id in held[s.replica_id]
            assert all(s.id not in held[r] for r in held if r != s.replica_id)
            # the state the turn built is on that replica: its committed count moved there
            info = ray.get(server.replicas[s.replica_id].get_session.remote(s.id))
            assert info.committed_tokens == committed == (turn + 1) * 12
            got = client.sessions.GetSession(pb.GetSessionRequest(session_id=s.id))
            assert got.replica_id == s.replica_id and got.committed_tokens == committed
    for s in sessions:
        assert s.close() is True
    server.wait_at_capacity()


def test_second_turn_continues_from_the_first(server, client):
    t1, t2 = tokens(1, 10), tokens(2, 6)
    with client.open() as a:
        out1, reason1, committed1 = drain_stream(a.generate(tokens=t1, max_new_tokens=8))
        out2, reason2, committed2 = drain_stream(a.generate(tokens=t2, max_new_tokens=8))
    assert reason1 == reason2 == pb.FINISH_REASON_LENGTH
    assert (committed1, committed2) == (18, 32)
    with client.open() as fresh:
        out, _, committed = drain_stream(fresh.generate(tokens=t1 + out1 + t2, max_new_tokens=8))
    assert committed == committed2
    assert out == out2, "turn 2 did not continue from turn 1's state"
    server.wait_at_capacity()


def test_converse_barge_in(server, client):
    q: queue.Queue = queue.Queue()
    call = client.sessions.Converse(open_requests(q), timeout=60)
    opened = next(call).opened
    assert opened.session_id and opened.replica_id in server.replicas
    q.put(pb.ConverseRequest(input=generate_request(tokens=tokens(3), max_new_tokens=400)))
    first_turn, second_turn, reasons, barged = [], [], [], False
    for response in call:
        chunk = response.chunk
        if not reasons:
            first_turn.extend(chunk.token_ids)
            if len(first_turn) >= 3 and not barged:  # barge in while the first turn generates
                q.put(
                    pb.ConverseRequest(input=generate_request(tokens=tokens(4), max_new_tokens=5))
                )
                barged = True
        else:
            second_turn.extend(chunk.token_ids)
        if chunk.finish_reason:
            reasons.append(chunk.finish_reason)
            if len(reasons) == 2:
                q.put(None)  # half-close: the stream ends after the turn in flight
    assert reasons == [pb.FINISH_REASON_INTERRUPTED, pb.FINISH_REASON_LENGTH]
    assert 3 <= len(first_turn) < 400
    assert len(second_turn) == 5
    assert call.code() == grpc.StatusCode.OK
    wait_for(
        lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
        2.0,
        what="the half-closed stream's session to be released",
    )
    server.wait_at_capacity()


def test_converse_cancel_releases_the_session(server, client):
    q: queue.Queue = queue.Queue()
    call = client.sessions.Converse(open_requests(q), timeout=60)
    opened = next(call).opened
    q.put(pb.ConverseRequest(input=generate_request(tokens=tokens(5), max_new_tokens=400)))
    got = 0
    for response in call:
        got += len(response.chunk.token_ids)
        if got >= 3:
            break
    assert opened.session_id in server.sessions_on()[opened.replica_id]
    call.cancel()
    wait_for(
        lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
        1.0,
        what="the cancelled stream's session to be released (within a second)",
    )
    assert (
        rpc_error(
            client.sessions.GetSession, pb.GetSessionRequest(session_id=opened.session_id)
        ).code()
        == grpc.StatusCode.NOT_FOUND
    )
    q.put(None)
    server.wait_at_capacity()


def test_open_waits_for_room_then_fails_or_succeeds(server, client):
    capacity = server.config.replicas * server.config.replica.pools.max_sessions
    sessions = [client.open() for _ in range(capacity)]
    held = server.sessions_on()
    assert all(len(held[r]) == server.config.replica.pools.max_sessions for r in held)

    started = time.monotonic()
    err = rpc_error(client.open)
    waited = time.monotonic() - started
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    assert err.details()
    assert waited >= OPEN_TIMEOUT_S - 0.5, f"OpenSession failed after {waited:.2f}s, no wait"

    result: dict = {}

    def open_one() -> None:
        try:
            result["session"] = client.open(timeout=30)
        except grpc.RpcError as exc:
            result["error"] = exc

    opener = threading.Thread(target=open_one)
    opener.start()
    time.sleep(0.5)  # the open is now waiting for room
    assert "session" not in result and "error" not in result
    freed = sessions.pop()
    assert freed.close() is True
    opener.join(30)
    assert "error" not in result, result.get("error")
    newcomer = result["session"]
    assert newcomer.replica_id == freed.replica_id
    sessions.append(newcomer)
    for s in sessions:
        assert s.close() is True
    server.wait_at_capacity()
