"""End to end: on a full cluster, a dead replica's sessions take the room before new sessions do.

Two replicas of two sessions each, no parking, all four held; three more opens wait for room.
One replica is SIGKILLed: its two sessions wait for room too (the survivor is full) until the
replacement joins empty with room for two. Both go there (restored, not ABORTED) while the three
opens keep waiting: a failover with sessions waiting for room claims it ahead of new opens
(``Opener.claim_room``). Then each session closed lets one waiting open in, and everything
closed leaves every pool at capacity. The same when one of the two held nothing yet (no turn,
so no checkpoint: it is opened again empty after the restore): its room is claimed from the
start too, so no waiting open takes it between the restore and the reopen.

The test kills a replica, so the module has its own server.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import ray

from tests.support.cluster import drain_stream, opens_waiting, tokens, wait_for
from tests.support.servers import grpc_client, serve_cluster

OPENS = 3


@pytest.fixture(scope="module")
def server(ray_cluster):
    flags = dict(replicas=2, max_sessions=2, max_parked_sessions=0, stale_after_s=3.0)
    with serve_cluster(**flags, open_timeout_s=120.0, failover_wait_s=120.0) as srv:
        yield srv


def turn(session, seed: int) -> int:
    """A turn, retried while its replica was lost and the session restored (UNAVAILABLE); the
    committed tokens after it."""
    for _ in range(60):
        try:
            return drain_stream(session.generate(tokens=tokens(seed), max_new_tokens=4))[2]
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
    raise AssertionError("the session was never served again")


@pytest.mark.parametrize("blank", [False, True], ids=["restored", "restored-and-blank"])
def test_a_dead_replicas_sessions_take_the_room_before_new_opens(server, blank):
    server.wait_at_capacity(server.wait_healed())
    with grpc_client(server.address) as client, ThreadPoolExecutor(OPENS) as pool:
        held = [client.open() for _ in range(4)]
        victim = held[0].replica_id
        lost = [s for s in held if s.replica_id == victim]
        assert len(lost) == 2  # the cluster is full: two on each replica
        empty = lost[1] if blank else None  # runs no turn: its store holds it as blank
        committed = {s.id: turn(s, n) if s is not empty else 0 for n, s in enumerate(held)}
        if empty is not None:
            store = server.stores[victim]
            wait_for(
                lambda: (
                    ray.get(store.sessions.remote(), timeout=10).get(empty.id, ("", None))[1]
                    is not None
                ),
                30,
                what="the store to hold the empty session as blank",
            )
        waiting = [pool.submit(client.open, timeout=120) for _ in range(OPENS)]
        wait_for(lambda: opens_waiting(server) == OPENS, 30, what="the opens to wait for room")

        server.sigkill_replica(victim)
        for n, s in enumerate(lost):  # restored (or opened again) where the replacement joined
            assert turn(s, 10 + n) == committed[s.id] + len(tokens(10 + n)) + 4
        assert opens_waiting(server) == OPENS  # the restores took the room first
        assert not any(f.done() for f in waiting)

        for n, s in enumerate(lost):  # each session closed lets one open in
            assert s.close()
            left = OPENS - 1 - n
            wait_for(lambda: opens_waiting(server) == left, 30, what="an open to land")  # noqa: B023
        for s in held:
            s.close()  # idempotent: the last open lands in the room these leave
        for f in waiting:
            assert f.result(timeout=60).close()
    server.wait_at_capacity(server.wait_healed())
