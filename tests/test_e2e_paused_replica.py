"""End to end: a replica that was paused (SIGSTOP) long enough to be declared dead, then continued
(SIGCONT), loses no session. The router fences it on its stale snapshots, fences its checkpoint
store and restores its sessions on the other replica from their checkpoints; the continued
replica goes on releasing its sessions (its own idle timeouts, the router's release of a fenced
replica's sessions), and none of those releases may take a checkpoint the failover reads. Every
session continues exactly where its last ended turn left it (a fresh session replaying the
same turns produces the same tokens), the paused replica is replaced, and nothing is left held.

The test pauses a replica, so the module has its own server.
"""

from __future__ import annotations

import os
import signal

import pytest
import ray

from replica.api import ReleaseReason
from router.client import SessionClient
from router.control.api import ReplicaHealth
from tests.support.cluster import actor_pid, drain_stream, wait_for
from tests.support.servers import serve_cluster

SEEDED = dict(temperature=0.7, seed=5)
IDLE_S = 300.0  # well beyond the pause: a restored session must not time out meanwhile


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(stale_after_s=3.0) as srv:
        yield srv


def tokens(seed: int, n: int = 5) -> list[int]:
    return [(seed * 37 + i * 11) % 250 + 1 for i in range(n)]


def health(server, replica_id: str) -> ReplicaHealth | None:
    views = ray.get(server.server.router.views.remote(), timeout=30)
    return next((v.health for v in views if v.replica_id == replica_id), None)


def test_a_paused_replica_that_comes_back_loses_no_session(server):
    client = SessionClient(server.address)
    sessions = [client.open(idle_timeout_s=IDLE_S) for _ in range(6)]
    done: dict[str, list] = {s.id: [] for s in sessions}
    for n, s in enumerate(sessions):
        for turn in range(2):
            seed = 10 * n + turn
            got = drain_stream(s.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED))
            done[s.id].append((seed, got))
    victim = sessions[0].replica_id
    doomed = [s.id for s in sessions if s.replica_id == victim]
    assert doomed and len(doomed) < len(sessions)
    handle = server.replicas[victim]
    pid = actor_pid(handle)

    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: health(server, victim) in (ReplicaHealth.DEAD, None), 60, 0.05, "fenced")
    finally:
        os.kill(pid, signal.SIGCONT)
    # continued, it releases its sessions as its idle timeouts would (unless it was killed
    # first): the releases reach its store before the failover reads it
    try:
        ray.get(handle.close_sessions.remote(doomed, ReleaseReason.IDLE_TIMEOUT), timeout=10)
    except ray.exceptions.RayError:
        pass  # killed as a dead replica already

    router = server.server.router
    live = server.wait_healed(180)
    assert victim not in live
    pinned = {r: set(ray.get(router.pinned_sessions.remote(r), timeout=30)) for r in live}
    for sid in done:  # every session is pinned to a live replica, none lost
        assert sum(sid in held for held in pinned.values()) == 1, (sid, pinned)
    for n, s in enumerate(sessions):  # each continues exactly where its last turn left it
        seed = 10 * n + 2
        got = drain_stream(s.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED))
        done[s.id].append((seed, got))
        replay = client.open()
        for seed, want in done[s.id]:
            assert (
                drain_stream(replay.generate(tokens=tokens(seed), max_new_tokens=6, **SEEDED))
                == want
            ), s.id
        assert replay.close() and s.close()
    wait_for(lambda: ray.get(router.session_count.remote()) == 0, 30, 0.1, "an empty table")
    live = server.wait_healed()
    server.wait_at_capacity(live)
    server.assert_no_leaks(live)
    client.close()
