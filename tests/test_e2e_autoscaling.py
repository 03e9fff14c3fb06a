"""Autoscaling on session pressure: a cluster of one replica, ``--max-replicas 2``. Sessions that
leave less free room than ``--scale-up-free-sessions`` add a replica; once a replica is idle and
the other's room can spare it, it is drained, retired and stopped, and no session is lost: the
replica that holds a session stays, and that session goes on. Metrics and logs say why."""

from __future__ import annotations

import urllib.request

import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient
from router.control.views import ReplicaHealth
from tests.support.cluster import ServerThread, drain_stream, wait_for
from tests.support.metrics import parse_samples, select

MAX_SESSIONS = 6
THRESHOLD = 2


@pytest.fixture(scope="module")
def server(ray_cluster):
    s = ServerThread(
        replicas=1,
        max_replicas=2,
        max_sessions=MAX_SESSIONS,
        scale_up_free_sessions=THRESHOLD,
        scale_up_after_s=0.0,
        scale_down_after_s=1.0,
    ).start()
    yield s
    s.stop()


def listed(server: ServerThread) -> dict[str, ReplicaHealth]:
    views = ray.get(server.server.router.views.remote(), timeout=30)
    return {v.replica_id: v.health for v in views}


def metrics(server: ServerThread) -> dict:
    with urllib.request.urlopen(server.server.metrics_url, timeout=10) as reply:
        return parse_samples(reply.read().decode())


def turn(session) -> None:
    ids, reason, _ = drain_stream(session.generate(tokens=[3, 4], max_new_tokens=3, timeout=60))
    assert len(ids) == 3 and reason == pb.FINISH_REASON_LENGTH


def test_a_replica_is_added_under_session_pressure_and_an_idle_one_removed(server):
    (first,) = server.replicas
    with SessionClient(server.address) as client:
        held = [client.open() for _ in range(MAX_SESSIONS - 1)]  # room 1 < THRESHOLD
        added = wait_for(
            lambda: [r for r, h in listed(server).items() if r != first and h.name == "HEALTHY"],
            120,
            0.2,
            "a replica added under session pressure",
        )[0]
        samples = metrics(server)
        assert select(samples, "session_router_scaling_steps_total", direction="up") == [1.0]
        assert select(samples, "session_router_replicas_desired") == [2.0]

        wait_for(lambda: server.server.gateway.cluster.handles.get(added), 10, 0.1, "its handle")
        newcomer = client.open()  # the new replica has the most room
        assert newcomer.replica_id == added
        turn(newcomer)
        for session in held:
            turn(session)
            assert session.close()
        # `first` is idle now, and `added` alone has room to spare: `first` goes
        wait_for(lambda: set(listed(server)) == {added}, 60, 0.2, f"{first} to be removed")
        assert set(server.replicas) == {added}
        assert server.server.supervisor.target == 1 and not server.server.starting
        turn(newcomer)  # the session on the replica that stays goes on
        samples = wait_for(  # retired, not dead: its series leave /metrics with the next poll
            lambda: (
                (s := metrics(server))
                and not select(s, "session_router_replica_up", replica=first)
                and s
            ),
            10,
            0.2,
            f"{first}'s series to leave /metrics",
        )
        assert select(samples, "session_router_scaling_steps_total", direction="down") == [1.0]
        assert select(samples, "session_router_replicas_desired") == [1.0]
        assert newcomer.close()
    server.wait_at_capacity()
