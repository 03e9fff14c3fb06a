"""Autoscaling on session pressure: a cluster of one replica, ``--max-replicas 2``. Sessions that
leave less free room than ``--scale-up-free-sessions`` add a replica; once a lightly loaded
replica's sessions fit in the other's room with room to spare, it is drained with migration,
retired and stopped, and no session is lost: its sessions go on on the replica that stays,
exactly where they were (the same tokens as a session that never moved), and nothing leaks.
Metrics and logs say why."""

from __future__ import annotations

import urllib.request

import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient
from router.control.api import ReplicaHealth
from tests.support.cluster import ServerThread, drain_stream, wait_for
from tests.support.metrics import parse_samples, select
from tests.support.servers import serve_cluster

MAX_SESSIONS = 6
THRESHOLD = 1  # up when no room is left; down when a replica's sessions fit with 2 to spare
PROMPTS = ([3, 4], [5, 6, 7], [8])


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(
        replicas=1,
        max_replicas=2,
        max_sessions=MAX_SESSIONS,
        scale_up_free_sessions=THRESHOLD,
        scale_up_after_s=0.0,
        scale_down_after_s=2.0,
    ) as s:
        yield s


def listed(server: ServerThread) -> dict[str, ReplicaHealth]:
    views = ray.get(server.server.router.views.remote(), timeout=30)
    return {v.replica_id: v.health for v in views}


def metrics(server: ServerThread) -> dict:
    with urllib.request.urlopen(server.server.metrics_url, timeout=10) as reply:
        return parse_samples(reply.read().decode())


def turn(session, prompt: list[int] = PROMPTS[0]) -> list[int]:
    ids, reason, _ = drain_stream(session.generate(tokens=prompt, max_new_tokens=3, timeout=60))
    assert len(ids) == 3 and reason == pb.FINISH_REASON_LENGTH
    return ids


def test_a_replica_is_added_under_session_pressure_and_a_light_one_drained_away(server):
    (first,) = server.replicas
    with SessionClient(server.address) as client:
        held = [client.open() for _ in range(MAX_SESSIONS)]  # no room left: < THRESHOLD
        added = wait_for(
            lambda: [r for r, h in listed(server).items() if r != first and h.name == "HEALTHY"],
            120,
            0.2,
            "a replica added under session pressure",
        )[0]
        # serve copies the controller's figures to /metrics about every second
        samples = wait_for(
            lambda: (
                (s := metrics(server))
                and select(s, "session_router_scaling_steps_total", direction="up")
                and s
            ),
            5,
            0.2,
            "the step up on /metrics",
        )
        assert select(samples, "session_router_scaling_steps_total", direction="up") == [1.0]
        assert select(samples, "session_router_replicas_desired") == [2.0]

        wait_for(lambda: server.server.gateway.cluster.handles.get(added), 10, 0.1, "its handle")
        newcomers = [client.open() for _ in range(2)]  # the new replica has the most room
        assert {s.replica_id for s in newcomers} == {added}
        for session in newcomers:
            turn(session)
        kept = held.pop()  # stays open on `first`, with a history, while `first` is removed
        first_turn = turn(kept, PROMPTS[0])
        for session in held:
            turn(session)
            assert session.close()
        # `first` holds 1 session, `added` 2: `first`'s fits in `added`'s room with 3 to spare
        wait_for(lambda: set(listed(server)) == {added}, 60, 0.2, f"{first} to be removed")
        assert set(server.replicas) == {added} and set(server.stores) <= {added}
        assert server.fleet().target == 1 and not server.fleet().starting
        server.assert_no_leaks([added])

        # the moved session goes on where it was: the same tokens as one that never moved
        later = [turn(kept, prompt) for prompt in PROMPTS[1:]]
        info = client.sessions.GetSession(pb.GetSessionRequest(session_id=kept.id), timeout=30)
        assert info.replica_id == added
        with client.open() as reference:
            assert [turn(reference, prompt) for prompt in PROMPTS] == [first_turn, *later]
        for session in newcomers:  # the sessions on the replica that stays go on too
            turn(session)
        samples = wait_for(  # retired, not dead: its series leave /metrics with the next poll
            lambda: (
                (s := metrics(server))
                and not select(s, "session_router_replica_up", replica=first)
                and select(s, "session_router_scaling_steps_total", direction="down")
                and s
            ),
            10,
            0.2,
            f"{first}'s series to leave /metrics",
        )
        steps = "session_router_scaling_steps_total"
        assert select(samples, steps, direction="down", reason="light_load") == [1.0]
        assert select(samples, "session_router_replicas_desired") == [1.0]
        for session in [kept, *newcomers]:
            assert session.close()
    server.wait_at_capacity()
