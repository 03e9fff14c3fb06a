"""End to end: a fork on a full replica waits for room there, as an open does (a close wakes
it), and is RESOURCE_EXHAUSTED when none appears within the wait; nothing is left behind. (A
module of its own: its server's replica asks for the CPU another module's server holds.)"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from router.client import SessionClient
from tests.support.cluster import ServerThread, drain_stream, rpc_error, tokens

Code = grpc.StatusCode


def turn(session, ids, new):
    return drain_stream(session.generate(tokens=ids, max_new_tokens=new))


@pytest.fixture(scope="module")
def full_server(ray_cluster):
    """One replica of two GPU sessions and no host tier: two open sessions fill it."""
    srv = ServerThread(replicas=1, max_sessions=2, max_parked_sessions=0, open_timeout_s=1.5)
    srv.start()
    yield srv
    srv.stop()


def test_a_fork_waits_for_room_on_its_replica(full_server):
    with SessionClient(full_server.address) as client:
        parent, other = client.open(), client.open()
        turn(parent, tokens(5, 11), 3)
        started = time.monotonic()
        err = rpc_error(client.fork, parent.id)
        assert err.code() == Code.RESOURCE_EXHAUSTED and "no room" in err.details()
        assert time.monotonic() - started >= 1.0  # it waited for room first
        full_server.assert_no_leaks()
        with ThreadPoolExecutor(1) as pool:
            forking = pool.submit(client.fork, parent.id, 30)
            time.sleep(0.3)
            assert other.close()  # room appears: the waiting fork takes it
            fork = forking.result(timeout=30)
        assert fork.replica_id == parent.replica_id
        assert turn(fork, tokens(6, 4), 3)[0] == turn(parent, tokens(6, 4), 3)[0]
        assert parent.close() and fork.close()
    full_server.wait_at_capacity()
