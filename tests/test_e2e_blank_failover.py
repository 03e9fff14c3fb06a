"""End to end: a replica dies before its new sessions' first checkpoints landed.

A session opened empty has no checkpoint until its first turn ends (it holds nothing to lose),
so a replica SIGKILLed right after the opens leaves its store holding none of its sessions.
None of them is lost: each is opened again, empty, on the other replica, with the same id and
idle timeout (it committed nothing a client saw); a turn running at the kill ends
UNAVAILABLE ("continues at committed_tokens 0") and its retry runs; every session's turns then
equal a fresh session's. Nothing ends ABORTED, and nothing is left held afterwards.

The test kills a replica, so the module has its own server.
"""

from __future__ import annotations

import os
import re
import signal

import grpc
import pytest
import ray

from replica.api import SessionInfo
from router.client import SessionClient
from tests.support.cluster import actor_pid, drain_stream, wait_for
from tests.support.servers import serve_cluster

SEEDED = dict(temperature=0.7, seed=7)
COMMITTED = re.compile(r"continues at committed_tokens (\d+)")
IDLE_S = 240.0


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(stale_after_s=3.0) as srv:
        yield srv


def tokens(seed: int, n: int = 5) -> list[int]:
    return [(seed * 31 + i * 7) % 250 + 1 for i in range(n)]


def continue_as_fresh(client: SessionClient, sessions) -> None:
    """Each session's next turn equals a fresh session's (it holds nothing, and is not lost)."""
    for n, s in enumerate(sessions):
        got = drain_stream(s.generate(tokens=tokens(n), max_new_tokens=8, **SEEDED))
        fresh = client.open()
        want = drain_stream(fresh.generate(tokens=tokens(n), max_new_tokens=8, **SEEDED))
        assert got == want, s.id
        assert fresh.close()


def test_sessions_without_a_checkpoint_are_opened_again_on_a_replica_death(server):
    client = SessionClient(server.address)
    sessions = [client.open(idle_timeout_s=IDLE_S) for _ in range(6)]
    victim = sessions[0].replica_id
    doomed = [s for s in sessions if s.replica_id == victim]
    assert doomed and len(doomed) < len(sessions)
    # the victim's store holds no checkpoint of any of them (the failpoint): only a reopen saves
    store = server.stores[victim]
    assert ray.get(store.stats.remote(), timeout=30)[0] == 0

    running = doomed[0].generate(tokens=[3, 4], max_new_tokens=400)
    assert next(running).token_ids  # a turn runs at the kill
    server.sigkill_replica(victim)
    with pytest.raises(grpc.RpcError) as ended:
        drain_stream(running)
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value.details()
    assert int(COMMITTED.search(ended.value.details()).group(1)) == 0

    continue_as_fresh(client, sessions)  # on the survivor
    live = server.wait_healed()
    assert victim not in live
    for s in doomed:  # same id, same idle timeout, on one live replica now
        infos = ray.get([server.replicas[r].get_session.remote(s.id) for r in live], timeout=30)
        holders = [info for info in infos if isinstance(info, SessionInfo)]
        assert len(holders) == 1 and holders[0].idle_timeout_s == IDLE_S, infos

    for s in sessions:
        assert s.close()
    wait_for(
        lambda: ray.get(server.server.router.session_count.remote()) == 0,
        30,
        0.1,
        "an empty router table",
    )
    server.wait_at_capacity(live)
    client.close()


def test_a_session_opened_again_empty_is_opened_again_when_that_replica_dies_too(server):
    """The sessions a failover opened again, empty, are as blank on their new replica as they
    were on the first: when it dies before their first turn, they are opened again once more,
    never ABORTED."""
    client = SessionClient(server.address)
    server.wait_healed()
    sessions = [client.open(idle_timeout_s=IDLE_S) for _ in range(6)]
    first = sessions[0].replica_id
    server.sigkill_replica(first)
    live = server.wait_healed()
    second = next(r for r in live if r != first)

    def pinned_to(replica_id: str) -> int:
        views = ray.get(server.server.router.views.remote(), timeout=30)
        return next((v.sessions_pinned for v in views if v.replica_id == replica_id), 0)

    wait_for(lambda: pinned_to(second) == len(sessions), 60, 0.1, "every session on one replica")
    server.sigkill_replica(second)  # before any of them ran a turn
    live = wait_for(
        lambda: [r for r in server.wait_healed() if r not in (first, second)] or None,
        120,
        0.5,
        "two replacement replicas",
    )
    continue_as_fresh(client, sessions)  # none ABORTED
    for s in sessions:
        assert s.close()
    server.wait_at_capacity(server.wait_healed())
    client.close()


def test_empty_sessions_a_replacement_store_holds_as_blank_are_opened_again(server):
    """Empty sessions on a replica whose checkpoint store was replaced (opened before the new
    store followed) and one that moved there empty: the new store is handed each of them as
    blank at once, so when the replica dies before their first turn they are opened again,
    never ABORTED. (Before, the failover went by how the router saw them open: one opened under
    the store before, or moved, counted as possibly holding state, and was lost.)"""
    client = SessionClient(server.address)
    live = server.wait_healed()
    sessions = [client.open(idle_timeout_s=IDLE_S) for _ in range(6)]
    victim = sessions[0].replica_id
    other = next(r for r in live if r != victim)
    mover = next((s for s in sessions if s.replica_id == other), None) or client.open(
        idle_timeout_s=IDLE_S
    )
    if mover not in sessions:
        sessions.append(mover)
    client.migrate(mover.id, victim, 60)  # arrives empty: its first checkpoint is its blank
    on_victim = [s.id for s in sessions if s is mover or s.replica_id == victim]

    old_store = server.stores[victim]
    pid = actor_pid(old_store)
    os.kill(pid, signal.SIGKILL)

    def blank_in_new_store() -> bool:
        store = server.stores.get(victim)
        if store is None or store._actor_id == old_store._actor_id:
            return False
        try:
            held = ray.get(store.sessions.remote(), timeout=10)
        except ray.exceptions.RayError:
            return False
        return all(held.get(sid, ("", None))[1] == IDLE_S for sid in on_victim)

    wait_for(blank_in_new_store, 60, 0.2, "the new store to hold the sessions as blank")
    server.sigkill_replica(victim)
    server.wait_healed(120)
    continue_as_fresh(client, sessions)  # none ABORTED
    for s in sessions:
        assert s.close()
    server.wait_at_capacity(server.wait_healed())
    client.close()
