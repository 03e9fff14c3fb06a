"""End to end: sessions stick to their replica, turns continue from saved state, a Generate whose
deadline passes is cancelled and rolled back, CloseSession during a turn ends it, a shorter
idle timeout is honoured, and OpenSession waits for room on full replicas.

A real ``Server`` (local Ray, two tiny-bamba replicas, loopback gRPC) is shared by the module.
"""

from __future__ import annotations

import threading

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from tests.support.cluster import (
    drain_stream,
    opens_waiting,
    rpc_error,
    tokens,
    wait_for,
)
from tests.support.servers import serve_cluster

OPEN_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(open_timeout_s=OPEN_TIMEOUT_S) as srv:
        yield srv


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


def test_open_waits_for_room_then_fails_or_succeeds(server, client):
    capacity = server.config.replicas * server.config.replica.pools.max_sessions
    sessions = [client.open() for _ in range(capacity)]
    held = server.sessions_on()
    assert all(len(held[r]) == server.config.replica.pools.max_sessions for r in held)

    # while it waits for room, a client deadline shorter than the wait passes first ...
    err = rpc_error(client.open, timeout=OPEN_TIMEOUT_S / 3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
    # ... and when no room comes, the server gives up after --open-timeout-s
    err = rpc_error(client.open)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
    assert err.details()

    result: dict = {}

    def open_one() -> None:
        try:
            result["session"] = client.open(timeout=30)
        except grpc.RpcError as exc:
            result["error"] = exc

    opener = threading.Thread(target=open_one)
    opener.start()
    wait_for(lambda: opens_waiting(server) == 1, 10, what="the open to wait for room")
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


def test_a_generate_whose_deadline_passes_is_cancelled_and_rolled_back(server, client):
    with client.open() as s:
        _, _, before = drain_stream(s.generate(tokens=tokens(3), max_new_tokens=4))
        err = rpc_error(s.generate, tokens=tokens(4), max_new_tokens=480, timeout=0.25)
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err

        def settled() -> bool:
            got = client.sessions.GetSession(pb.GetSessionRequest(session_id=s.id))
            return not got.turn_running and got.committed_tokens == before

        wait_for(settled, 10, what="the turn to be cancelled and the session rolled back")
        _, reason, after = drain_stream(s.generate(tokens=tokens(5), max_new_tokens=3))
        assert (reason, after) == (pb.FINISH_REASON_LENGTH, before + 8 + 3)
    server.wait_at_capacity()


def test_close_session_during_a_turn_ends_the_turn_and_frees_everything(server, client):
    s = client.open()
    streaming = s.generate(tokens=tokens(6), max_new_tokens=480, timeout=60)
    next(streaming)
    assert client.close_session(s.id) is True
    err = rpc_error(lambda: streaming)
    assert err.code() == grpc.StatusCode.CANCELLED and "closed" in err.details(), err
    get = rpc_error(client.sessions.GetSession, pb.GetSessionRequest(session_id=s.id))
    assert get.code() == grpc.StatusCode.NOT_FOUND
    server.wait_at_capacity()


def test_a_shorter_idle_timeout_is_honoured(server, client):
    short, default = client.open(idle_timeout_s=1.0), client.open()
    wait_for(
        lambda: short.id not in server.sessions_on()[short.replica_id],
        15,
        what="the session that asked for 1 s to be released when idle",
    )
    assert default.id in server.sessions_on()[default.replica_id]  # the default is 300 s
    err = rpc_error(short.generate, tokens=[1], max_new_tokens=1)
    assert err.code() == grpc.StatusCode.NOT_FOUND, err
    assert default.close() is True
    server.wait_at_capacity()
