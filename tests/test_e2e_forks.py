"""End to end: ForkSession over gRPC with API keys. A fork lives on its parent's replica, is its
owner's (another tenant gets PERMISSION_DENIED for the parent and for the fork), starts from the
parent's committed state (its turns equal a cold session's that was fed the same tokens), and
nothing is left behind when parent and forks close, in either order."""

from __future__ import annotations

import secrets

import grpc
import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient
from tests.support.cluster import drain_stream, rpc_error, tokens
from tests.support.servers import ALICE, BOB

Code = grpc.StatusCode


@pytest.fixture
def server(tenants_server):
    """The server with API keys on (conftest.py's tenants_server)."""
    return tenants_server


def turn(session, ids, new):
    return drain_stream(session.generate(tokens=ids, max_new_tokens=new))


def test_fork_continues_the_parent_on_its_replica(server):
    with SessionClient(server.address, api_key=ALICE) as alice:
        parent = alice.open()
        a, b, c = tokens(1, 21), tokens(2, 5), tokens(3, 7)
        o1, _, committed = turn(parent, a, 6)
        forks = [parent.fork(timeout=30), parent.fork(timeout=30)]
        for fork in forks:
            assert fork.replica_id == parent.replica_id and fork.id != parent.id
            got = alice.sessions.GetSession(
                pb.GetSessionRequest(session_id=fork.id), metadata=alice.metadata
            )
            assert got.committed_tokens == committed and got.replica_id == parent.replica_id
        cold = alice.open()
        turn(cold, a + o1, 0)
        want_b, _, _ = turn(cold, b, 8)
        assert turn(forks[0], b, 8)[0] == want_b
        assert turn(parent, b, 8)[0] == want_b
        grandchild = forks[0].fork(timeout=30)  # a fork of a fork, after its own turn
        assert grandchild.replica_id == parent.replica_id
        assert turn(grandchild, c, 4)[0] == turn(forks[0], c, 4)[0]
        server.assert_no_leaks()
        assert parent.close()  # the parent first: its forks keep the shared pages
        assert len(turn(forks[1], c, 3)[0]) == 3
        for s in (cold, *forks, grandchild):
            assert s.close()
    server.wait_at_capacity()


def test_only_the_owner_may_fork(server):
    with (
        SessionClient(server.address, api_key=ALICE) as alice,
        SessionClient(server.address, api_key=BOB) as bob,
    ):
        parent = alice.open()
        turn(parent, tokens(4, 9), 2)
        fork = parent.fork(timeout=30)
        for target in (parent.id, fork.id):
            err = rpc_error(bob.fork, target)
            assert err.code() == Code.PERMISSION_DENIED and err.details()
        err = rpc_error(bob.generate, fork.id, tokens=[1], max_new_tokens=1)
        assert err.code() == Code.PERMISSION_DENIED
        assert rpc_error(alice.fork, secrets.token_hex(16)).code() == Code.NOT_FOUND
        assert rpc_error(alice.fork, "").code() == Code.INVALID_ARGUMENT
        assert fork.close() and parent.close()
        assert rpc_error(alice.fork, parent.id).code() == Code.NOT_FOUND
    server.wait_at_capacity()
