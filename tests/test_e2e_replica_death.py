"""End to end: a replica killed under its sessions, without session checkpoints (``--no-session-
checkpoints``; with them, tests/test_e2e_failover.py). Its sessions' next turn is ABORTED (and a
turn streaming when it died ends ABORTED instead of hanging), the other replica's sessions are
untouched, new sessions never go to the dead one, ListReplicas shows it DEAD, and a replacement
brings the cluster back to --replicas replicas.

The test kills a replica, so the module has its own Server.
"""

from __future__ import annotations

import os
import signal

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient
from tests.support.cluster import actor_pid, drain_stream, rpc_error, wait_for
from tests.support.servers import serve_cluster

STALE_AFTER_S = 2.0


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(stale_after_s=STALE_AFTER_S, session_checkpoints=False) as srv:
        yield srv


def test_replica_death(server):
    client = SessionClient(server.address)
    sessions = [client.open() for _ in range(6)]
    by_replica: dict[str, list] = {}
    for s in sessions:
        by_replica.setdefault(s.replica_id, []).append(s)
    assert set(by_replica) == set(server.replicas), "sessions not spread over both replicas"
    committed = {}
    for n, s in enumerate(sessions):
        _, _, committed[s.id] = drain_stream(s.generate(tokens=[n + 1, 2, 3], max_new_tokens=3))
    victim = sessions[0].replica_id
    (survivor,) = [r for r in server.replicas if r != victim]
    doomed, spared = by_replica[victim], by_replica[survivor]
    survivor_sessions = server.sessions_on([survivor])[survivor]

    # a turn streaming on the victim when it dies ends with ABORTED; it does not hang
    streaming = doomed[0].generate(tokens=[7, 8], max_new_tokens=400, timeout=30)
    next(streaming)
    ray.kill(server.replicas[victim], no_restart=True)
    try:
        for _ in streaming:
            pass
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.ABORTED, exc
        assert "open a new session" in exc.details()
    else:  # a turn that hung instead would end DEADLINE_EXCEEDED after the call's 30 s
        raise AssertionError("the turn streaming on the dead replica ended normally")

    for s in doomed:
        err = rpc_error(s.generate, tokens=[9], max_new_tokens=2)
        assert err.code() == grpc.StatusCode.ABORTED, err
        assert err.details()
        assert s.close() is False  # nothing left to close

    # the survivor's sessions are untouched: same state, and a turn continues from it
    assert server.sessions_on([survivor])[survivor] == survivor_sessions
    for s in spared:
        ids, reason, now = drain_stream(s.generate(tokens=[9], max_new_tokens=2))
        assert (len(ids), reason, now) == (2, pb.FINISH_REASON_LENGTH, committed[s.id] + 3)

    # new sessions never land on the dead replica
    fresh = [client.open() for _ in range(4)]
    assert victim not in {s.replica_id for s in fresh}
    for s in fresh:
        drain_stream(s.generate(tokens=[1, 2], max_new_tokens=2))

    # ListReplicas reports the dead replica DEAD (stale snapshot or failed ping at the latest)
    def states() -> dict[str, int]:
        return {r.replica_id: r.state for r in client.replicas()}

    wait_for(
        lambda: states()[victim] == pb.REPLICA_STATE_DEAD,
        STALE_AFTER_S * 3,
        0.2,
        "ListReplicas to show the killed replica DEAD",
    )
    assert states()[survivor] == pb.REPLICA_STATE_HEALTHY
    server.assert_no_leaks([survivor])
    live = server.wait_healed()  # the cluster is back to --replicas: a replacement joined
    assert victim not in live and victim not in server.replicas and len(live) == 2

    for s in spared + fresh:
        assert s.close() is True
    server.wait_at_capacity(live)
    client.close()


def test_router_detects_a_silent_death(server):
    """A replica no gateway streams from dies: the router's stale-snapshot check and failed ping
    mark it DEAD on their own, and placement stops choosing it. It was an extra replica
    (beyond --replicas), so it is not replaced."""
    server.wait_healed()
    (added,) = server.start_replicas(1)
    client = SessionClient(server.address)

    def state_of(replica_id: str) -> int:
        return {r.replica_id: r.state for r in client.replicas()}.get(replica_id, 0)

    wait_for(
        lambda: any(r.replica_id == added and r.pools for r in client.replicas()),
        10,
        0.2,
        "the new replica's first snapshot",
    )
    assert state_of(added) == pb.REPLICA_STATE_HEALTHY
    ray.kill(server.replicas[added], no_restart=True)
    wait_for(
        lambda: state_of(added) == pb.REPLICA_STATE_DEAD,
        STALE_AFTER_S * 4,
        0.2,
        "the router to mark the silent replica DEAD",
    )
    alive = [r.replica_id for r in client.replicas() if r.state == pb.REPLICA_STATE_HEALTHY]
    assert alive and added not in alive
    sessions = [client.open() for _ in range(3)]
    assert {s.replica_id for s in sessions} <= set(alive)
    for s in sessions:
        drain_stream(s.generate(tokens=[4, 5], max_new_tokens=2))
        assert s.close() is True
    server.wait_at_capacity(alive)
    client.close()


def test_router_restart_rebuilds_the_session_table(server):
    """The router actor dies and Ray restarts it empty: the replicas re-register with the sessions
    they hold, so those sessions stay routable and closable, and placement works again."""
    client = SessionClient(server.address)
    alive = server.wait_healed()
    sessions = [client.open() for _ in range(4)]
    for s in sessions:
        drain_stream(s.generate(tokens=[3, 1, 4], max_new_tokens=2))
    router = server.server.router
    ray.kill(router, no_restart=False)  # Ray restarts it (max_restarts=-1) with an empty table

    def rebuilt() -> bool:
        try:
            pinned = sum(v.sessions_pinned for v in ray.get(router.views.remote(), timeout=5))
        except Exception:  # noqa: BLE001 - still restarting
            return False
        return pinned == len(sessions)

    wait_for(rebuilt, 30, 0.2, "the restarted router to rebuild its session table")
    for s in sessions:  # routable through the router (GetSession) and still holding their state
        assert (
            client.sessions.GetSession(pb.GetSessionRequest(session_id=s.id)).committed_tokens == 5
        )
        drain_stream(s.generate(tokens=[1], max_new_tokens=1))
    fresh = client.open()
    assert fresh.replica_id in alive
    for s in [*sessions, fresh]:
        assert s.close() is True
    server.wait_at_capacity(alive)
    client.close()


def test_a_paused_replica_is_declared_dead_killed_and_replaced(server):
    """Real stale-snapshot detection: the replica's process is paused (SIGSTOP), so its snapshots
    stop and it answers no ping; the router declares it dead on its own and its sessions' clients
    get ABORTED. Had it only been slow, its state still must not come back: the serve process
    kills it for good and a replacement takes its place."""
    client = SessionClient(server.address)
    alive = server.wait_healed()
    sessions = [client.open() for _ in range(2 * len(alive))]
    victim = sessions[0].replica_id
    handle = server.replicas[victim]
    mine = [s for s in sessions if s.replica_id == victim]
    pid = actor_pid(handle)

    def aborted(session) -> bool:  # the gateway follows the router's verdict within a poll
        try:
            drain_stream(session.generate(tokens=[1], max_new_tokens=1, timeout=5))
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.ABORTED
        return False

    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: (
                {r.replica_id: r.state for r in client.replicas()}[victim] == pb.REPLICA_STATE_DEAD
            ),
            STALE_AFTER_S * 5,
            0.2,
            "the router to declare the paused replica dead",
        )
        for s in mine:
            wait_for(lambda s=s: aborted(s), 10, 0.2, "calls on its sessions to abort")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)  # so that the kill can land if it has not yet
        except ProcessLookupError:
            pass
    live = server.wait_healed()
    assert victim not in live
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(handle.ping.remote(), timeout=30)
    for s in sessions:
        if s not in mine:
            assert s.close() is True
    server.wait_at_capacity(live)
    client.close()


def test_drain_replica_keeps_its_sessions_and_takes_no_new_ones(server):
    client = SessionClient(server.address)
    server.wait_healed()
    (added,) = server.start_replicas(1)
    wait_for(
        lambda: any(r.replica_id == added and r.pools for r in client.replicas()),
        10,
        0.2,
        "the new replica's first snapshot",
    )
    alive = [r.replica_id for r in client.replicas() if r.state == pb.REPLICA_STATE_HEALTHY]
    assert len(alive) >= 2
    sessions = [client.open() for _ in range(2 * len(alive))]
    target = sessions[0].replica_id
    kept = [s for s in sessions if s.replica_id == target]
    reply = client.admin.DrainReplica(pb.DrainReplicaRequest(replica_id=target))
    assert reply.replica.replica_id == target
    assert reply.replica.state == pb.REPLICA_STATE_DRAINING
    assert {r.replica_id: r.state for r in client.replicas()}[target] == pb.REPLICA_STATE_DRAINING
    for s in kept:  # its sessions stay and keep working
        ids, reason, _ = drain_stream(s.generate(tokens=[2, 7], max_new_tokens=2))
        assert len(ids) == 2 and reason == pb.FINISH_REASON_LENGTH
    fresh = [client.open() for _ in range(4)]
    assert target not in {s.replica_id for s in fresh}
    err = rpc_error(client.admin.DrainReplica, pb.DrainReplicaRequest(replica_id="no-such"))
    assert err.code() == grpc.StatusCode.NOT_FOUND and err.details()
    for s in sessions + fresh:
        assert s.close() is True
    server.wait_at_capacity(alive)
    client.close()
