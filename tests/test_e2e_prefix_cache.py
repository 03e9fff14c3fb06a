"""End to end over gRPC, two replicas: OpenSession with prefix_tokens or prefix_text starts from
a state a replica cached at a turn boundary (Session.cached_tokens), is routed to the replica
holding the longest cached prefix (a prefix-less open goes to the other, which has more room),
and continues exactly as a cold session fed the same tokens. Bad prefixes are refused with the
right status; nothing leaks."""

from __future__ import annotations

import time

import grpc
import pytest
import ray

from router.client import SessionClient
from tests.support.cluster import ServerThread, drain_stream, rpc_error, tokens

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def server(ray_cluster):
    srv = ServerThread(open_timeout_s=1.0).start()
    yield srv
    srv.stop()


def turn(session, ids, new):
    return drain_stream(session.generate(tokens=ids, max_new_tokens=new))


def wait_cached(server, replica_id: str, timeout: float = 20.0) -> None:
    """Until the router's view of ``replica_id`` shows cached states, and the gateway's poll of
    the router's views (every second) has had time to see it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = ray.get(server.server.router.views.remote(), timeout=30)
        snap = {v.replica_id: v.snapshot for v in views}[replica_id]
        if snap is not None and snap.state_cache.block_hashes:
            time.sleep(2.5)
            return
        time.sleep(0.2)
    raise AssertionError(f"{replica_id} never reported cached states")


def test_prefix_tokens_open_where_the_prefix_is_cached(server):
    with SessionClient(server.address) as client:
        prefix = tokens(5, 200)
        first = client.open()
        out, _, _ = turn(first, prefix, 6)  # cached: 200 tokens, and 205 at the turn's end
        wait_cached(server, first.replica_id)
        other = client.open()  # no prefix: the replica with more room
        assert other.replica_id != first.replica_id
        second = client.open(prefix_tokens=[*prefix, *out], timeout=30)
        assert second.replica_id == first.replica_id
        assert (second.cached_tokens, second.committed_tokens) == (205, 206)
        got, _, _ = turn(second, [3], 8)
        cold = client.open()
        assert turn(cold, [*prefix, *out, 3], 8)[0] == got
        for s in (first, other, second, cold):
            assert s.close()
    server.wait_at_capacity()


def test_prefix_text_is_tokenized_as_turn_text(server):
    text = "The turn-boundary cache keeps states keyed by the tokens folded into them. " * 2
    ids = list(text.encode("utf-8"))  # tiny-bamba's byte tokenizer
    with SessionClient(server.address) as client:
        first = client.open(prefix_text=text)
        assert (first.cached_tokens, first.committed_tokens) == (0, len(ids))
        turn(first, [1], 0)  # folds the text and 1: cached under those tokens
        wait_cached(server, first.replica_id)
        second = client.open(prefix_tokens=[*ids, 1, 2], timeout=30)
        assert second.replica_id == first.replica_id
        assert (second.cached_tokens, second.committed_tokens) == (len(ids) + 1, len(ids) + 2)
        assert first.close() and second.close()
    server.wait_at_capacity()


def test_bad_prefixes_are_refused(server):
    with SessionClient(server.address) as client:
        err = rpc_error(client.open, prefix_tokens=[1, 10**6])
        assert err.code() == Code.INVALID_ARGUMENT and "vocabulary" in err.details()
        err = rpc_error(client.open, prefix_tokens=[1] * 513)
        assert err.code() == Code.OUT_OF_RANGE and "context" in err.details()
    server.wait_at_capacity()
