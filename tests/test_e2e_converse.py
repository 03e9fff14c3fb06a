"""End to end: Converse, the full-duplex stream whose session lives exactly as long as the
stream. Barge-in (new input interrupts the running turn), the ``Interrupt`` message, half-close
while a turn runs (the turn finishes, then the session is released), client cancel and a refused
input (the session is released at once).

A real ``Server`` (local Ray, two tiny-bamba replicas, loopback gRPC) is shared by the module.
"""

from __future__ import annotations

import queue

import grpc
import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient, generate_request
from tests.support.cluster import ServerThread, rpc_error, tokens, wait_for
from tests.support.servers import serve_cluster


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster() as srv:
        yield srv


def released(server: ServerThread, opened: pb.Session) -> None:
    wait_for(
        lambda: opened.session_id not in server.sessions_on()[opened.replica_id],
        10,
        what="the stream's session to be released",
    )
    server.wait_at_capacity()


def open_requests(q: queue.Queue):
    """A Converse request iterator: ``open`` first, then whatever is put on ``q`` (None ends)."""
    yield pb.ConverseRequest(open=pb.OpenSessionRequest())
    while (item := q.get()) is not None:
        yield item


def converse(client: SessionClient) -> tuple[queue.Queue, grpc.Call, pb.Session]:
    """A Converse stream, opened: its request queue (None half-closes), the call, the session."""
    q: queue.Queue = queue.Queue()
    call = client.sessions.Converse(open_requests(q), timeout=60)
    return q, call, next(call).opened


def test_converse_barge_in(server, client):
    q, call, opened = converse(client)
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
    released(server, opened)


def test_converse_cancel_releases_the_session(server, client):
    q, call, opened = converse(client)
    q.put(pb.ConverseRequest(input=generate_request(tokens=tokens(5), max_new_tokens=400)))
    got = 0
    for response in call:
        got += len(response.chunk.token_ids)
        if got >= 3:
            break
    assert opened.session_id in server.sessions_on()[opened.replica_id]
    call.cancel()
    q.put(None)
    released(server, opened)
    get = rpc_error(client.sessions.GetSession, pb.GetSessionRequest(session_id=opened.session_id))
    assert get.code() == grpc.StatusCode.NOT_FOUND


def test_converse_refused_input_ends_stream_and_releases(server, client):
    """A refused input in a Converse ends the stream with its code; the session is released."""
    q, call, opened = converse(client)
    q.put(pb.ConverseRequest(input=generate_request(tokens=[1, 10_000], max_new_tokens=2)))
    try:
        for _ in call:
            pass
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and exc.details()
    else:
        raise AssertionError("a refused input did not end the stream")
    finally:
        q.put(None)
    released(server, opened)


def test_half_close_while_a_turn_runs_finishes_the_turn_then_releases(server, client):
    q, call, opened = converse(client)
    q.put(pb.ConverseRequest(input=generate_request(tokens=tokens(6), max_new_tokens=30)))
    q.put(None)  # half-close at once: the turn has barely started
    chunks = [response.chunk for response in call]
    assert sum(len(c.token_ids) for c in chunks) == 30
    assert chunks[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert chunks[-1].committed_tokens == 8 + 30
    assert call.code() == grpc.StatusCode.OK
    released(server, opened)


def test_the_interrupt_message_ends_the_running_turn(server, client):
    q, call, opened = converse(client)
    q.put(pb.ConverseRequest(interrupt=pb.Interrupt()))  # nothing runs: nothing to end
    q.put(pb.ConverseRequest(input=generate_request(tokens=tokens(7), max_new_tokens=400)))
    streamed, interrupted = 0, False
    for response in call:
        streamed += len(response.chunk.token_ids)
        if response.chunk.finish_reason:
            break
        if streamed >= 3 and not interrupted:
            q.put(pb.ConverseRequest(interrupt=pb.Interrupt()))
            interrupted = True
    first = response.chunk
    assert first.finish_reason == pb.FINISH_REASON_INTERRUPTED
    assert 3 <= streamed < 400
    assert first.committed_tokens == 8 + streamed  # what it generated stays committed
    q.put(pb.ConverseRequest(input=generate_request(tokens=tokens(8), max_new_tokens=2)))
    for response in call:
        if response.chunk.finish_reason:
            break
    assert response.chunk.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.chunk.committed_tokens == first.committed_tokens + 8 + 2
    q.put(None)
    assert list(call) == [] and call.code() == grpc.StatusCode.OK
    released(server, opened)
    get = rpc_error(client.sessions.GetSession, pb.GetSessionRequest(session_id=opened.session_id))
    assert get.code() == grpc.StatusCode.NOT_FOUND
