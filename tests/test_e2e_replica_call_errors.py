"""End to end: a replica call that raises inside a healthy replica (the failpoint
``replica_call_raises``: each replica's first open and first turn submission raise once) fails
that one call INTERNAL with a message, is counted in /metrics, and blames nobody: the replica stays
HEALTHY in ListReplicas, its sessions stay on it (no failover, with checkpoints on), the next turn
on the same session runs from where the session was, and nothing leaks. Issue 19: any exception
from a replica call was taken as its death, fencing a healthy replica and failing over all its
sessions. A replica whose process is SIGKILLed afterwards is still fenced and failed over.

The failpoint is in the environment only while the module's server starts its replicas; the last
test kills a replica, so the module has its own server.
"""

from __future__ import annotations

import logging
import os
import signal
import urllib.request

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import SessionClient
from tests.support.cluster import actor_pid, drain_stream, wait_for
from tests.support.metrics import parse_samples, select
from tests.support.servers import serve_cluster

INTERNAL_HINT = "stays in service"
ERRORS = "session_router_replica_call_errors_total"


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(failpoints="replica_call_raises", stale_after_s=3.0) as srv:
        yield srv


def scrape(server) -> str:
    with urllib.request.urlopen(server.server.metrics_url, timeout=10) as reply:
        return reply.read().decode()


def states(client: SessionClient) -> dict[str, int]:
    return {r.replica_id: r.state for r in client.replicas()}


def router_views(server) -> dict:
    return {v.replica_id: v for v in ray.get(server.server.router.views.remote(), timeout=30)}


def open_until_spread(client: SessionClient, server, count: int):
    """``count`` sessions over every replica, and the opens refused on the way."""
    sessions, refused = [], []
    for _ in range(count + 2 * len(server.replicas)):
        try:
            sessions.append(client.open())
        except grpc.RpcError as exc:
            refused.append(exc)
        if len(sessions) >= count and {s.replica_id for s in sessions} == set(server.replicas):
            break
    return sessions, refused


def test_an_application_error_fails_one_call_and_fences_nothing(server, caplog):
    caplog.set_level(logging.ERROR, logger="router.gateway.follow")
    client = SessionClient(server.address)
    first = set(server.replicas)
    sessions, refused = open_until_spread(client, server, 6)
    assert {s.replica_id for s in sessions} == first, "sessions not spread over both replicas"
    assert len(refused) == len(first)  # each replica's first open raised, once
    for err in refused:
        assert err.code() == grpc.StatusCode.INTERNAL, err
        assert INTERNAL_HINT in err.details() and "InjectedCallError" in err.details(), err
    assert set(states(client).values()) == {pb.REPLICA_STATE_HEALTHY}

    pinned = server.sessions_on()
    failed_turns = {}
    for n, s in enumerate(sessions):
        try:
            drain_stream(s.generate(tokens=[n + 1, 2, 3], max_new_tokens=3, timeout=30))
        except grpc.RpcError as err:  # each replica's first submission raises, once
            assert err.code() == grpc.StatusCode.INTERNAL, err
            assert INTERNAL_HINT in err.details() and "submit_turns" in err.details(), err
            failed_turns[s.id] = s
    assert {s.replica_id for s in failed_turns.values()} == first
    assert len(failed_turns) == len(first)

    # the sessions whose turn failed are where they were, unchanged, and go on from there
    for s in failed_turns.values():
        ids, reason, committed = drain_stream(s.generate(tokens=[7, 8, 9], max_new_tokens=3))
        assert (len(ids), reason, committed) == (3, pb.FINISH_REASON_LENGTH, 6)
    assert server.sessions_on() == pinned  # nothing moved: no failover, no release
    assert set(server.replicas) == first
    assert set(states(client).values()) == {pb.REPLICA_STATE_HEALTHY}
    for view in router_views(server).values():
        assert view.sessions_lost == 0 and not any(view.sessions_migrated.values()), view

    logged = [  # once each, with its traceback, where the gateway caught it
        r for r in caplog.records if r.exc_info and "InjectedCallError" in r.getMessage()
    ]
    assert len(logged) == len(refused) + len(failed_turns), [r.getMessage() for r in logged]
    samples = parse_samples(scrape(server))
    for method in ("open_sessions", "submit_turns"):
        assert select(samples, ERRORS, method=method, kind="application") == [len(first)]
    assert not select(samples, ERRORS, kind="dead")
    assert not select(samples, ERRORS, kind="transient")

    for s in sessions:
        assert s.close() is True
    server.wait_at_capacity()
    client.close()


def test_a_killed_replica_is_still_fenced_and_failed_over(server):
    client = SessionClient(server.address)
    sessions, _ = open_until_spread(client, server, 4)
    for n, s in enumerate(sessions):
        drain_stream(s.generate(tokens=[n + 1, 2], max_new_tokens=2))
    victim = sessions[0].replica_id
    (survivor,) = set(server.replicas) - {victim}
    doomed = [s for s in sessions if s.replica_id == victim]
    pid = actor_pid(server.replicas[victim])
    os.kill(pid, signal.SIGKILL)

    wait_for(
        lambda: states(client).get(victim, pb.REPLICA_STATE_DEAD) == pb.REPLICA_STATE_DEAD,
        20,
        0.2,
        "the killed replica to be DEAD",
    )
    for s in doomed:  # restored on the survivor from its checkpoint: it continues there
        for _ in range(3):
            try:
                ids, reason, committed = drain_stream(s.generate(tokens=[5], max_new_tokens=2))
                break
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
        assert (len(ids), reason, committed) == (2, pb.FINISH_REASON_LENGTH, 7)
    assert {s.id for s in doomed} <= server.sessions_on([survivor])[survivor]
    assert router_views(server)[victim].sessions_migrated.get("failover") == len(doomed)
    samples = parse_samples(scrape(server))
    assert not select(samples, ERRORS, kind="transient")  # a dead replica is not retried
    for s in sessions:
        assert s.close() is True
    server.wait_at_capacity([survivor])
    client.close()
