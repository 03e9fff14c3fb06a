"""End to end: clients that used to take capacity away silently (issue 8), each reproduced.

- a poisoned request (``temperature=1e-45``) killed the replica's engine; now it is greedy and the
  replica keeps serving;
- ids echoed in error messages came back whole (a 10 KB id); now they are cut;
- opens abandoned while waiting for room (client deadline, cancel) were placed anyway once room
  appeared, holding slots for nobody; now they leave no session behind;
- the idle timeout released a Converse session whose stream was open; now an open stream keeps
  it, and gRPC keepalive finds a dead peer, whose stream's end releases it;
- inputs sent faster than turns start queued without bound (a stream ended 6.5 s after its
  client stopped); now they are merged in order into the next turn, and the stream ends promptly
  after half-close with nothing held.

One server for the module: capacity 8 sessions (2 replicas x 4), opens wait at most 3 s for
room, keepalive pings every second.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient, generate_request
from tests.support.cluster import drain_stream, rpc_error, wait_for
from tests.support.servers import serve_cluster

OPEN_TIMEOUT_S = 3.0
REPO = Path(__file__).resolve().parent.parent
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(
        max_sessions=4,
        kv_tokens=16384,
        max_context=4096,
        open_timeout_s=OPEN_TIMEOUT_S,
        keepalive_s=1.0,
    ) as srv:
        yield srv


def test_a_temperature_too_small_to_compute_is_greedy_and_the_replica_keeps_serving(server, client):
    with client.open() as poisoned, client.open() as greedy:
        got = drain_stream(poisoned.generate(tokens=[9, 8, 7], max_new_tokens=8, temperature=1e-45))
        assert got == drain_stream(greedy.generate(tokens=[9, 8, 7], max_new_tokens=8))
        assert got[1] == pb.FINISH_REASON_LENGTH
        again = drain_stream(poisoned.generate(tokens=[1], max_new_tokens=4, temperature=0.7))
        assert again[1] == pb.FINISH_REASON_LENGTH
    assert {r.state for r in client.replicas()} == {pb.REPLICA_STATE_HEALTHY}
    sessions = [client.open() for _ in range(4)]  # both replicas take and serve sessions
    for s in sessions:
        assert drain_stream(s.generate(tokens=[3], max_new_tokens=2))[1] == pb.FINISH_REASON_LENGTH
        s.close()
    server.wait_at_capacity()


def test_ids_echoed_in_errors_are_cut(server, client):
    huge = "x" * 10_000
    errors = [
        rpc_error(client.generate, huge, tokens=[1], max_new_tokens=1),
        rpc_error(client.sessions.GetSession, pb.GetSessionRequest(session_id=huge)),
        rpc_error(client.admin.DrainReplica, pb.DrainReplicaRequest(replica_id=huge)),
        rpc_error(client.admin.ResumeReplica, pb.ResumeReplicaRequest(replica_id=huge)),
    ]
    for err in errors:
        assert err.code() == Code.NOT_FOUND, err
        assert "10000 characters" in err.details() and len(err.details()) < 300, err.details()


def test_abandoned_opens_under_overload_leave_no_session(server, client):
    capacity = server.config.replicas * server.config.replica.pools.max_sessions
    before = sum(s.sessions_opened_total for s in server.snapshots().values())
    held = [client.open() for _ in range(capacity)]
    fired = time.monotonic()
    codes: list[grpc.StatusCode] = []

    def open_with_deadline() -> None:  # waits for room, then the client's deadline passes
        codes.append(rpc_error(client.open, timeout=0.5).code())

    def open_then_cancel() -> None:  # a Converse whose client gives up while it waits
        call = client.sessions.Converse(iter([pb.ConverseRequest(open=pb.OpenSessionRequest())]))
        threading.Timer(0.3, call.cancel).start()
        try:
            next(call)
        except grpc.RpcError as exc:
            codes.append(exc.code())

    threads = [threading.Thread(target=open_with_deadline) for _ in range(12)]
    threads += [threading.Thread(target=open_then_cancel) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for s in held:  # room appears while the router could still be waiting on the abandoned opens
        assert s.close() is True
    assert Counter(codes) == {Code.DEADLINE_EXCEEDED: 12, Code.CANCELLED: 4}
    # every open the router waited on has ended by now, whatever ended it
    wait_for(lambda: time.monotonic() > fired + OPEN_TIMEOUT_S + 1.0, 10, 0.1, "open timeouts")
    server.wait_at_capacity()
    after = sum(s.sessions_opened_total for s in server.snapshots().values())
    assert after - before == capacity, "an abandoned open was placed"
    assert server.call(_router_sessions(server)) == 0


async def _router_sessions(server) -> int:
    return await server.server.router.session_count.remote()


def converse(client: SessionClient, inbox: queue.Queue, idle_timeout_s: float = 0.0, timeout=60):
    """A Converse call whose requests come from ``inbox`` (None half-closes)."""

    def requests():
        yield pb.ConverseRequest(open=pb.OpenSessionRequest(idle_timeout_s=idle_timeout_s))
        while (item := inbox.get()) is not None:
            yield item

    return client.sessions.Converse(requests(), timeout=timeout)


def test_converse_outlives_its_idle_timeout_while_the_stream_is_open(server, client):
    inbox: queue.Queue = queue.Queue()
    call = converse(client, inbox, idle_timeout_s=1.0)
    opened = next(call).opened
    plain = client.open(idle_timeout_s=1.0)  # the oracle: the same timeout, no stream
    wait_for(
        lambda: plain.id not in server.sessions_on()[plain.replica_id],
        10,
        0.2,
        "the plain session's idle timeout",
    )
    assert opened.session_id in server.sessions_on()[opened.replica_id]
    inbox.put(pb.ConverseRequest(input=generate_request(tokens=[1, 2], max_new_tokens=3)))
    inbox.put(None)
    chunks = [response.chunk for response in call]
    assert chunks[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert chunks[-1].committed_tokens == 5
    wait_for(
        lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
        10,
        0.1,
        "the stream's end to release the session",
    )
    server.wait_at_capacity()


def test_barge_in_storm_is_merged_and_ends_promptly_with_nothing_held(server, client):
    inputs = 1500
    half_closed: list[float] = []

    def storm():
        yield pb.ConverseRequest(open=pb.OpenSessionRequest())
        for n in range(inputs):
            tokens = [1 + n % 200, 2]
            yield pb.ConverseRequest(input=generate_request(tokens=tokens, max_new_tokens=4))
        half_closed.append(time.monotonic())

    call = client.sessions.Converse(storm(), timeout=120)
    opened = next(call).opened
    generated, turns, last = 0, 0, None
    for response in call:
        generated += len(response.chunk.token_ids)
        if response.chunk.finish_reason:
            turns, last = turns + 1, response.chunk
    ended = time.monotonic()
    print(f"barge-in storm: {inputs} inputs, {turns} turns, ended {ended - half_closed[0]:.2f} s")
    assert last.committed_tokens == 2 * inputs + generated, "an input was dropped"
    assert turns < inputs / 4, "inputs were not merged"
    wait_for(
        lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
        10,
        0.1,
        "the storm's session to be released",
    )
    server.wait_at_capacity()


PEER = """
import sys, threading, time
import grpc
from protos import session_router_pb2 as pb, session_router_pb2_grpc as pb_grpc
stub = pb_grpc.SessionServiceStub(grpc.insecure_channel(sys.argv[1]))
def requests():
    yield pb.ConverseRequest(open=pb.OpenSessionRequest())
    threading.Event().wait()
call = stub.Converse(requests())
print(next(call).opened.session_id, flush=True)
time.sleep(3600)
"""


def test_keepalive_ends_the_stream_of_a_dead_peer(server):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, server.address], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        session_id = peer.stdout.readline().strip()
        assert session_id, "the peer did not open its Converse"
        assert any(session_id in held for held in server.sessions_on().values())
        peer.send_signal(signal.SIGSTOP)  # alive to the kernel, silent to HTTP/2 pings
        wait_for(
            lambda: not any(session_id in held for held in server.sessions_on().values()),
            20,
            0.2,
            "keepalive to end the stopped peer's stream and release its session",
        )
    finally:
        peer.kill()
        peer.wait(10)
    server.wait_at_capacity()
