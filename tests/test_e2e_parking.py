"""End to end through gRPC: a replica with 4 GPU session slots and 40 in host memory keeps 24
sessions open and serves a turn on each, in any order, twice; sessions report ``parked``,
ListReplicas and /metrics show the host tier, parks and restores; every pool stays consistent and
is back at capacity after the sessions close.
"""

from __future__ import annotations

import random
import urllib.request

import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient
from tests.support.cluster import drain_stream, wait_for
from tests.support.metrics import parse_samples, select
from tests.support.servers import serve_cluster

SESSIONS = 24


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(replicas=1, max_sessions=4, max_parked_sessions=40) as srv:
        yield srv


def get_session(client: SessionClient, session_id: str) -> pb.Session:
    return client.sessions.GetSession(pb.GetSessionRequest(session_id=session_id))


def test_a_replica_serves_six_times_more_sessions_than_gpu_slots(server):
    rng = random.Random(0)
    with SessionClient(server.address) as client:
        sessions = [client.open(timeout=30) for _ in range(SESSIONS)]
        parked = [get_session(client, s.id).parked for s in sessions]
        assert sum(parked) == SESSIONS - 4  # the 4 most recent are resident, the rest parked
        committed = dict.fromkeys((s.id for s in sessions), 0)
        for turn in range(2):
            order = sessions[:]
            rng.shuffle(order)
            for n, session in enumerate(order):
                prompt = [(7 * n + 3 * turn + i) % 200 + 1 for i in range(5 + n % 4)]
                ids, reason, done = drain_stream(session.generate(tokens=prompt, max_new_tokens=3))
                assert len(ids) == 3 and reason == pb.FINISH_REASON_LENGTH, session.id
                committed[session.id] += len(prompt) + 3
                assert done == committed[session.id]
                info = get_session(client, session.id)
                assert not info.parked and info.committed_tokens == done
            server.assert_no_leaks()

        def settled():  # the router's view is the replica's last pushed snapshot
            (replica,) = client.replicas()
            return replica if replica.running_requests == 0 else None

        replica = wait_for(settled, timeout=10, what="a snapshot taken after the last turn")
        assert replica.sessions == SESSIONS and replica.sessions_parked == SESSIONS - 4
        pools = {p.pool: p for p in replica.pools}
        assert pools["host_mamba"].capacity == 40
        assert pools["host_mamba"].session_held == SESSIONS - 4
        assert pools["req"].session_held == 4
        assert all(p.leaked == 0 for p in replica.pools)

        parking = server.snapshots()["replica-0"].parking
        assert parking.restores_total >= 2 * (SESSIONS - 4)
        assert parking.parks_total >= parking.restores_total

        def exported(name: str) -> float:
            url = server.server.metrics_url
            samples = parse_samples(urllib.request.urlopen(url, timeout=10).read().decode())
            return sum(select(samples, name, replica="replica-0"))

        wait_for(
            lambda: exported("session_router_session_restores_total") == parking.restores_total,
            timeout=10,
            what="/metrics to count the restores",
        )
        assert exported("session_router_restore_seconds_count") == parking.restores_total
        assert exported("session_router_sessions_parked") == SESSIONS - 4

        for session in sessions:
            assert session.close()
    server.wait_at_capacity()
