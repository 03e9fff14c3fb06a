"""End to end: a replica whose engine loop dies while its process lives (the failpoint
``engine_step_raises``). Issue 8: the engine thread died on a poisoned request, the actor kept
pushing its last snapshot, the router kept it HEALTHY and placed sessions on it, and the client
that triggered it hung until its deadline.

Now the replica is dead at once: without session checkpoints (``--no-session-checkpoints``; with
them its sessions would be restored elsewhere, tests/test_e2e_failover.py) the turn that killed it
and every later call on its sessions end ABORTED, ListReplicas shows it DEAD long before any
staleness check could (``stale_after_s`` is a minute here), nothing is placed on it, a replacement
joins empty and serves, and once the router forgets it its series leave /metrics. The failpoint is
in the environment only while the module's server starts its first replicas, so the replacement is
healthy.
"""

from __future__ import annotations

import urllib.request

import grpc
import pytest

from protos import session_router_pb2 as pb
from router.client import SessionClient
from tests.support.cluster import drain_stream, rpc_error, wait_for
from tests.support.servers import serve_cluster


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(
        failpoints="engine_step_raises",
        stale_after_s=60.0,
        dead_replica_retention_s=8.0,
        session_checkpoints=False,
    ) as srv:
        yield srv


def test_engine_loop_death_makes_the_replica_dead_and_replaced(server):
    client = SessionClient(server.address)
    first = set(server.replicas)
    sessions = [client.open() for _ in range(4)]
    victim = sessions[0].replica_id
    doomed = [s for s in sessions if s.replica_id == victim]
    spared = [s for s in sessions if s.replica_id != victim]
    assert doomed and spared

    err = rpc_error(doomed[0].generate, tokens=[1, 2, 3], max_new_tokens=4, timeout=30)
    assert err.code() == grpc.StatusCode.ABORTED, err  # not a hang until the deadline
    assert "open a new session" in err.details()
    for s in doomed:
        err = rpc_error(s.generate, tokens=[4], max_new_tokens=2, timeout=30)
        assert err.code() == grpc.StatusCode.ABORTED, err

    def states() -> dict[str, int]:
        return {r.replica_id: r.state for r in client.replicas()}

    assert states()[victim] == pb.REPLICA_STATE_DEAD

    def scrape() -> str:
        with urllib.request.urlopen(server.server.metrics_url, timeout=10) as reply:
            return reply.read().decode()

    dead_up = f'session_router_replica_up{{replica="{victim}"}} 0.0'
    wait_for(lambda: dead_up in scrape(), 5, 0.2, "replica_up 0 for the dead replica")
    assert f'session_router_pool_slots{{replica="{victim}"' not in scrape()
    for _ in range(4):  # nothing is placed on it
        fresh = client.open()
        assert fresh.replica_id != victim
        fresh.close()

    def healed() -> list[str]:
        live = [r for r, state in states().items() if state == pb.REPLICA_STATE_HEALTHY]
        return live if len(live) == server.config.replicas else []

    live = wait_for(healed, 60, 0.2, "a replacement replica to join")
    (replacement,) = set(live) - first
    assert victim not in server.replicas
    with client.open() as s:  # the replacement joined empty and serves (no failpoint in it)
        if s.replica_id == replacement:
            ids, reason, committed = drain_stream(s.generate(tokens=[5, 6], max_new_tokens=3))
            assert (len(ids), reason, committed) == (3, pb.FINISH_REASON_LENGTH, 5)
    assert server.snapshots([replacement])[replacement].sessions_opened_total <= 1
    wait_for(
        lambda: f'replica="{victim}"' not in scrape(),
        20,
        0.2,
        "the dead replica's series to leave /metrics",
    )
    assert victim not in states()
    for s in spared:
        assert s.close() is True
    server.wait_at_capacity(live)
    client.close()
