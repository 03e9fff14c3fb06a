"""End to end: a replica that dies while the router restarts, and a router that dies during a
replica's failover. Ray restarts the router with empty tables, and the router learns its
replicas and their sessions from the replicas themselves; a dead replica never tells it. The
controller knows that replica and its checkpoint store, and hands both to the router once every
live replica is back in its table: the sessions the store holds that no live replica holds (a
failover tells the store which ones it restored) fail over as from any dead replica, and
continue exactly (a fresh session replaying the same turns produces the same tokens), and those
that held nothing yet (no checkpoint: the store knows them as blank) open again empty; nothing
is restored twice, nothing ends ABORTED or NOT_FOUND, and no slot or checkpoint is left behind.

The tests kill the router and replicas, so each has a server of its own.
"""

from __future__ import annotations

import os
import signal

import pytest
import ray

from router.client import SessionClient
from router.control.api import ReplicaHealth
from tests.support.cluster import actor_pid, drain_stream, wait_for
from tests.support.servers import serve_cluster

SEEDED = dict(temperature=0.7, seed=7)
SESSIONS = 6
TURNS = 3


@pytest.fixture
def server(ray_cluster):
    with serve_cluster(stale_after_s=3.0) as srv:
        yield srv


def turn_tokens(k: int, n: int) -> list[int]:
    return [(k * 31 + n * 17 + i * 7) % 250 + 1 for i in range(4)]


def views(server) -> list:
    try:
        return ray.get(server.server.router.views.remote(), timeout=5)
    except Exception:  # noqa: BLE001 - still restarting
        return []


def run_turns(sessions) -> dict[str, list[tuple[list[int], int]]]:
    """``TURNS`` seeded turns on each session: its replies and committed tokens, by session."""
    replies: dict[str, list[tuple[list[int], int]]] = {s.id: [] for s in sessions}
    for n in range(TURNS):
        for k, s in enumerate(sessions):
            ids, _, committed = drain_stream(
                s.generate(tokens=turn_tokens(k, n), max_new_tokens=6, **SEEDED)
            )
            replies[s.id].append((ids, committed))
    return replies


def test_a_replica_that_dies_while_the_router_restarts_fails_over(server):
    client = SessionClient(server.address)
    sessions = [client.open() for _ in range(SESSIONS)]
    victim = sessions[0].replica_id
    doomed = [s for s in sessions if s.replica_id == victim]
    assert 0 < len(doomed) < SESSIONS  # placement spreads them over both replicas
    replies = run_turns(sessions)
    blanks = [client.open() for _ in range(4)]  # no turn yet: nothing to checkpoint
    blank_doomed = [b.id for b in blanks if b.replica_id == victim]
    assert blank_doomed, [b.replica_id for b in blanks]
    store = server.stores[victim]

    def store_knows_blanks() -> bool:  # a blank entry rides with the next item, or waits 0.25 s
        held = ray.get(store.sessions.remote(), timeout=10)
        return all(held.get(sid, ("", None))[1] is not None for sid in blank_doomed)

    wait_for(store_knows_blanks, 10, 0.05, "the victim's store to know its blank sessions")
    victim_pid = actor_pid(server.replicas[victim])

    ray.kill(server.server.router, no_restart=False)  # Ray restarts it with empty tables
    os.kill(victim_pid, signal.SIGKILL)  # dies before it could register with the new router

    # the next turns come at once: those of the victim's sessions wait for their failover
    replies.update({b.id: [] for b in blanks})
    check_continues(server, client, [*sessions, *blanks], replies)
    dead = next(v for v in views(server) if v.replica_id == victim)
    assert dead.health == ReplicaHealth.DEAD and dead.sessions_lost == 0, dead
    assert dead.sessions_migrated.get("failover") == len(doomed) + len(blank_doomed), dead
    check_clean(server, victim, [*sessions, *blanks])
    client.close()


def test_a_router_that_dies_during_a_failover_leaves_the_rest_to_its_successor(ray_cluster):
    """Four GPU slots a replica and no host slots: of the victim's three sessions one fits on
    the survivor, the other two wait for the replacement replica, and the router dies while they
    wait. Its successor restores the two from the store (the one restored is not restored
    again)."""
    with serve_cluster(stale_after_s=3.0, max_sessions=4, max_parked_sessions=0) as server:
        client = SessionClient(server.address)
        sessions = [client.open() for _ in range(SESSIONS)]
        victim = sessions[0].replica_id
        doomed = [s for s in sessions if s.replica_id == victim]
        assert len(doomed) == SESSIONS // 2, [s.replica_id for s in sessions]
        survivor = next(s.replica_id for s in sessions if s.replica_id != victim)
        replies = run_turns(sessions)
        os.kill(actor_pid(server.replicas[victim]), signal.SIGKILL)

        def one_restored() -> bool:
            listed = {v.replica_id: v for v in views(server)}
            return survivor in listed and listed[survivor].sessions_pinned == 4

        wait_for(one_restored, 30, 0.02, "the survivor to take the one session it has room for")
        ray.kill(server.server.router, no_restart=False)  # while two wait for the replacement

        def all_restored() -> bool:
            listed = views(server)
            return sum(v.sessions_pinned for v in listed if v.replica_id != victim) == SESSIONS

        wait_for(all_restored, 120, 0.2, "the rest of the failover after the router restart")
        check_continues(server, client, sessions, replies)
        check_clean(server, victim, sessions)
        client.close()


def check_continues(server, client, sessions, replies) -> None:
    """Every session continues exactly where its last turn left it, on a live replica, and is
    held exactly once."""
    for k, s in enumerate(sessions):
        n = len(replies[s.id])  # the turn after its last (the first for a blank session)
        ids, _, committed = drain_stream(
            s.generate(tokens=turn_tokens(k, n), max_new_tokens=6, **SEEDED)
        )
        replay = client.open()
        for m, (want, at) in enumerate([*replies[s.id], (ids, committed)]):
            got, _, got_at = drain_stream(
                replay.generate(tokens=turn_tokens(k, m), max_new_tokens=6, **SEEDED)
            )
            assert (got, got_at) == (want, at), (s.id[:8], m)
        assert replay.close()
    held = [sid for ids in server.sessions_on().values() for sid in ids]
    assert sorted(held) == sorted(s.id for s in sessions)  # each exactly once: none twice


def check_clean(server, victim: str, sessions) -> None:
    """Closed, the sessions leave every live pool at capacity and every live store empty; the
    dead replica's store was ended."""
    for s in sessions:
        assert s.close() is True
    live = server.wait_healed()
    assert victim not in live
    server.wait_at_capacity(live)

    def stores_empty() -> bool:
        stores = server.stores
        stats = ray.get([stores[r].stats.remote() for r in live], timeout=30)
        return all(count == 0 for count, _ in stats)

    wait_for(stores_empty, 30, 0.1, "the live replicas' checkpoint stores to be empty")
    assert victim not in server.fleet().stores  # handed over with its replica, then ended
