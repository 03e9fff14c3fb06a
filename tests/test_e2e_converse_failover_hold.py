"""End to end: a quiet Converse stream whose session has a short idle timeout, and whose replica
is SIGKILLed.

A Converse session lives as long as its stream: its gateway holds a lease on it, renewed every
few seconds where the session is. A failover restores it on another replica, and the gateway
learns where only once the failover's outcome reaches it, then renews there at its next round;
a session whose idle timeout is shorter than that gap was released on its new replica before
the lease came, and the stream's next input found it gone (``NOT_FOUND``, 2-7 sessions of
every ``bench.chaos`` run, whose idle timeout is 3 s). A checkpoint now carries the session's
stream lease, and a failover holds a session a stream held for 15 s (one lease) where it lands:
the stream goes on, exactly, after a pause of several idle timeouts.

The test kills a replica, so the module has its own server.
"""

from __future__ import annotations

import queue
import time

import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient, generate_request
from tests.support.cluster import drain_stream
from tests.support.servers import serve_cluster

IDLE_S = 1.0
QUIET_S = 6.0  # several idle timeouts, and more than a lease renewal round (3 s)


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(stale_after_s=3.0) as srv:
        yield srv


def reply(responses) -> list[int]:
    ids = []
    for response in responses:
        ids += response.chunk.token_ids
        if response.chunk.finish_reason:
            return ids
    raise AssertionError("the stream ended before the turn did")


def test_a_quiet_converse_session_survives_its_replicas_death(server):
    client = SessionClient(server.address)
    requests: queue.Queue = queue.Queue()
    responses = client.sessions.Converse(iter(requests.get, None), timeout=120)
    requests.put(pb.ConverseRequest(open=pb.OpenSessionRequest(idle_timeout_s=IDLE_S)))
    session = next(responses).opened
    requests.put(pb.ConverseRequest(input=generate_request(tokens=[3, 4], max_new_tokens=4)))
    first = reply(responses)

    server.sigkill_replica(session.replica_id)
    time.sleep(QUIET_S)
    requests.put(pb.ConverseRequest(input=generate_request(tokens=[5], max_new_tokens=3)))
    went_on = reply(responses)  # not NOT_FOUND: the session was held where it was restored
    requests.put(None)
    assert list(responses) == []

    fresh = client.open()
    assert drain_stream(fresh.generate(tokens=[3, 4], max_new_tokens=4))[0] == first
    assert drain_stream(fresh.generate(tokens=[5], max_new_tokens=3))[0] == went_on
    assert fresh.close()
    server.wait_at_capacity(server.wait_healed())
    client.close()
