"""End to end: a replica whose snapshots go stale, as the router and the alerts must see it (a
paused replica process, which answers no ping either, is declared dead: test_e2e_replica_death).

- A replica that stops pushing snapshots (failpoint ``drop_snapshots``) but serves and answers
  pings: the router keeps it healthy while its snapshot ages past ``--stale-after-s``, and
  Prometheus with the project's rules puts ``SnapshotStale`` into pending (its short-for variant
  fires) while ``ReplicaDown`` stays quiet.
- The router's view of that replica is stale, so it believes it has room when it is full: the
  replica refuses the open and the router places the session on another replica.
"""

from __future__ import annotations

import pytest
import ray

from protos import session_router_pb2 as pb
from replica.api import Opened
from router.client import SessionClient
from tests.support.prometheus import Prometheus
from tests.support.servers import serve_cluster

STALE_AFTER_S = 2.0
STALE_ALERT_AFTER_S = 10  # SnapshotStale's threshold in deploy/prometheus/alerts.yml


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(replicas=1, stale_after_s=STALE_AFTER_S) as srv:  # + the silent one
        yield srv


@pytest.fixture(scope="module")
def silent_replica(server) -> str:
    """One more replica, started with ``drop_snapshots``: it serves and answers pings but pushes
    no snapshot of its own (opens and closes through the router still bring one back)."""
    (replica_id,) = server.start_replicas(1, frozenset({"drop_snapshots"}))
    return replica_id


def healthy(client: SessionClient) -> list[str]:
    return [r.replica_id for r in client.replicas() if r.state == pb.REPLICA_STATE_HEALTHY]


def test_a_replica_that_stops_reporting_is_stale_not_dead(server, silent_replica, client, tmp_path):
    prom = Prometheus.start(tmp_path / "prometheus", server.server.metrics.port, short_for=True)
    try:
        prom.wait_alert("SnapshotStale", {"pending", "firing"}, timeout=30, replica=silent_replica)
        prom.wait_alert(
            "SnapshotStale", {"firing"}, timeout=15, short_for=True, replica=silent_replica
        )
        for short_for in (False, True):
            assert not prom.alerts("ReplicaDown", short_for, replica=silent_replica)
        up = prom.scalar(f'session_router_replica_up{{replica="{silent_replica}"}}')
    finally:
        prom.stop()
    assert up == 1
    # the router knows its snapshot is stale, and keeps it: it answers the router's probes
    info = {r.replica_id: r for r in client.replicas()}[silent_replica]
    assert info.state == pb.REPLICA_STATE_HEALTHY
    assert info.snapshot_age_s > STALE_ALERT_AFTER_S > STALE_AFTER_S


def test_the_router_tries_another_replica_when_the_chosen_one_refuses(
    server, silent_replica, client
):
    alive = healthy(client)
    spread = [client.open() for _ in alive]  # one on each: every open makes its replica fuller
    assert sorted(s.replica_id for s in spread) == sorted(alive)
    for s in spread:
        if s.replica_id == silent_replica:  # the close reply tells the router it is empty
            assert s.close() is True
    # fill the silent replica behind the router's back: the router still sees it empty
    handle = server.replicas[silent_replica]
    direct = [f"direct-{i}" for i in range(server.config.replica.pools.max_sessions)]
    for sid in direct:
        assert isinstance(ray.get(handle.open_session.remote(sid)), Opened)
    free = {
        r.replica_id: next(p.free for p in r.pools if p.pool == "mamba")
        for r in client.replicas()
        if r.replica_id in alive
    }
    others = max(v for k, v in free.items() if k != silent_replica)
    assert free[silent_replica] > others, f"placement would not pick it first: {free}"

    newcomer = client.open()  # placed on the silent replica, refused there, placed elsewhere
    assert newcomer.replica_id in alive and newcomer.replica_id != silent_replica
    assert server.sessions_on([silent_replica])[silent_replica] == set(direct)

    assert newcomer.close() is True
    for s in spread:
        s.close()
    ray.get(handle.close_sessions.remote(direct))
    server.wait_at_capacity(alive)


def test_placement_sees_a_resume_at_once_not_at_the_next_report(server, silent_replica, client):
    """ResumeReplica takes effect for placement at once. The silent replica never reports, so
    the snapshot the router holds is the one of its last close reply, taken while it drained."""
    # its view may be stale from an earlier test (sessions closed on it behind the router's
    # back): a resume of the healthy replica hands the router and this gateway its snapshot
    client.admin.ResumeReplica(pb.ResumeReplicaRequest(replica_id=silent_replica))
    first = client.open()  # ties go to replica-0
    second = client.open()  # the silent replica has more room now
    assert (first.replica_id, second.replica_id) == ("replica-0", silent_replica)
    client.admin.DrainReplica(pb.DrainReplicaRequest(replica_id=silent_replica))
    assert second.close() is True  # its reply's snapshot says "draining"
    reply = client.admin.ResumeReplica(pb.ResumeReplicaRequest(replica_id=silent_replica))
    assert reply.replica.state == pb.REPLICA_STATE_HEALTHY
    third = client.open()  # the silent replica is empty, replica-0 holds one session
    assert third.replica_id == silent_replica
    for s in (first, third):
        assert s.close() is True
    server.wait_at_capacity([first.replica_id, third.replica_id])
