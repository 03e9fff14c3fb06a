"""End to end: a replica releases a session on its own (idle timeout), then dies before it tells
the router.

The router still pins the session there when the replica dies, and its failover finds no
checkpoint of it: the replica's store freed it at the release. It is not lost (the replica
ended it, as it would have with the router told): it ends as released, a turn on it answers
NOT_FOUND (open a new session), and the router counts no session lost with the replica
(``SessionsLostWithReplica`` stays quiet). Its neighbour, with a checkpoint, is restored and
continues exactly. (Before, the failover took it for a session that never held anything and
opened it again, empty: a closed session back to life; one the router had from a replica's
registration instead ended ABORTED, counted lost.)

The replica that dies is one started with the failpoint ``drop_snapshots``: it reports nothing
on its own, so its release never reaches the router before the kill (on a replica that reports,
the window is the second between two reports). The module has its own server.
"""

from __future__ import annotations

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient
from router.control.api import ReplicaHealth
from tests.support.cluster import drain_stream, wait_for
from tests.support.servers import serve_cluster

BRIEF_IDLE_S = 1.0
LONG_IDLE_S = 240.0


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(replicas=1) as srv:
        yield srv


def view_of(server, replica_id: str):
    views = ray.get(server.server.router.views.remote(), timeout=30)
    return next((v for v in views if v.replica_id == replica_id), None)


def test_a_session_released_just_before_its_replica_died_is_not_lost(server):
    (silent,) = server.start_replicas(1, frozenset({"drop_snapshots"}))
    client = SessionClient(server.address)
    others = [r for r in server.wait_healed() if r != silent]
    for r in others:  # every open lands on the silent replica
        client.admin.DrainReplica(pb.DrainReplicaRequest(replica_id=r))
    kept = client.open(idle_timeout_s=LONG_IDLE_S)
    brief = client.open(idle_timeout_s=BRIEF_IDLE_S)
    for r in others:
        client.admin.ResumeReplica(pb.ResumeReplicaRequest(replica_id=r))
    assert kept.replica_id == brief.replica_id == silent
    prompt = [5, 6, 7]
    first = drain_stream(kept.generate(tokens=prompt, max_new_tokens=6))
    drain_stream(brief.generate(tokens=prompt, max_new_tokens=6))

    handle = server.replicas[silent]
    store = server.stores[silent]
    for holder, what in [
        (handle.list_sessions, "the idle timeout to end the brief session on its replica"),
        (store.sessions, "its release to reach the store (which frees its checkpoint)"),
    ]:
        wait_for(lambda h=holder: brief.id not in ray.get(h.remote(), timeout=30), 30, 0.1, what)
    assert kept.id in ray.get(store.sessions.remote(), timeout=30)
    router = server.server.router
    assert brief.id in ray.get(router.pinned_sessions.remote(silent), timeout=30)  # not told

    server.sigkill_replica(silent)
    wait_for(
        lambda: not ray.get(router.pinned_sessions.remote(silent), timeout=30),
        60,
        0.2,
        "the failover of the dead replica",
    )
    view = view_of(server, silent)
    assert view is None or (view.health == ReplicaHealth.DEAD and view.sessions_lost == 0)

    with pytest.raises(grpc.RpcError) as gone:
        drain_stream(brief.generate(tokens=prompt, max_new_tokens=2))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND, gone.value.details()

    # the neighbour was restored from its checkpoint: its next turn equals one on a session
    # that never moved (the same two turns, on the restored copy and on a new session)
    more = [8, 9]
    went_on = drain_stream(kept.generate(tokens=more, max_new_tokens=6))
    fresh = client.open()
    assert drain_stream(fresh.generate(tokens=prompt, max_new_tokens=6)) == first
    assert drain_stream(fresh.generate(tokens=more, max_new_tokens=6)) == went_on
    for s in (kept, fresh):
        assert s.close()
    server.wait_at_capacity(server.wait_healed(120))
    client.close()
