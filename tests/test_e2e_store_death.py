"""End to end: a checkpoint store dies alone, under load.

One replica's ``CheckpointStore`` process is SIGKILLed while every session runs turns back to
back. No turn is held up by the missing store (each ends within a few seconds of the slowest
turn before the kill, with no error); the store is replaced by a new one, which holds a
checkpoint of every session of that replica within seconds (its ``checkpoints`` pool shows them
held again, and ``session_router_sessions_recheckpointed_total`` counts them);
``session_router_sessions_unprotected`` rises while no store holds them and is back to 0 after,
in the replica's snapshots and on /metrics; nothing leaks (strict invariant). Then the replica
itself dies: every one of its sessions is restored from the new store's checkpoints (no ABORTED).

The test kills actors, so the module has its own server.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request

import grpc
import pytest
import ray

from replica.checkpoints.holds import HOLD_S
from router.client import SessionClient
from router.control.fleet import Fleet
from tests.support.cluster import ServerThread, actor_pid, drain_stream, tokens, wait_for
from tests.support.metrics import parse_samples, select

SESSIONS = 8
SLACK_S = 5.0  # how much longer than the slowest turn before the kill any turn may take


@pytest.fixture(scope="module")
def server(ray_cluster):
    # turns back to back for a minute or more: room for a thousand short turns (8 tokens) per
    # session (a quiet box ran 256 of them, all 2,048 positions, within one test: OUT_OF_RANGE)
    srv = ServerThread(stale_after_s=3.0, max_context=8192, kv_tokens=8 * 8192).start()
    yield srv
    srv.stop()


def sigkill(handle) -> None:
    """Kill an actor's worker process the hard way (no Ray shutdown path runs)."""
    os.kill(actor_pid(handle), signal.SIGKILL)


class Turns:
    """One session's client: turns back to back until ``stop``, each one timed; a turn that
    fails UNAVAILABLE (its replica died) is retried, any other error is kept."""

    def __init__(self, client: SessionClient, k: int) -> None:
        self.session = client.open()
        self.k = k
        self.took: list[tuple[float, float]] = []  # (start, seconds) of each ended turn
        self.unavailable = 0
        self.errors: list[grpc.RpcError] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                ids, _, _ = drain_stream(
                    self.session.generate(tokens=tokens(100 * self.k + n, 4), max_new_tokens=4)
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self.unavailable += 1
                    continue
                self.errors.append(exc)
                return
            assert len(ids) == 4
            self.took.append((start, time.monotonic() - start))
            n += 1


def same_actor(a, b) -> bool:
    """Whether two handles name one actor (handles that crossed Ray are new objects)."""
    return a._actor_id == b._actor_id


def checkpoint_state(server, replica_id: str) -> tuple[int, int, int]:
    """(unprotected sessions, checkpoints held by the store, sessions open) of an exact
    snapshot."""
    snap = server.snapshots([replica_id])[replica_id]
    pool = snap.pool("checkpoints")
    return snap.checkpoints.unprotected, pool.capacity - pool.free, snap.open_sessions


def exported(server, name: str, replica_id: str) -> list[float]:
    with urllib.request.urlopen(server.server.metrics_url, timeout=10) as reply:
        return select(parse_samples(reply.read().decode()), name, replica=replica_id)


def test_a_dead_store_is_replaced_and_its_sessions_checkpointed_again(server):
    client = SessionClient(server.address)
    loads = [Turns(client, k) for k in range(SESSIONS)]
    victim = loads[0].session.replica_id
    mine = [load for load in loads if load.session.replica_id == victim]
    assert len(mine) >= 2
    for load in loads:
        load.thread.start()
    wait_for(lambda: all(len(load.took) >= 3 for load in loads), 120, 0.05, "three turns each")
    wait_all_checkpointed(server, victim, len(mine), 10, "every session of the victim checkpointed")
    wait_for(  # /metrics shows the router's latest snapshot of the replica, a moment behind
        lambda: exported(server, "session_router_sessions_unprotected", victim) == [0],
        10,
        what="/metrics to show every session protected",
    )
    slowest_before = max(took for load in loads for _, took in load.took)
    old_store = server.stores[victim]

    killed_at = time.monotonic()
    sigkill(old_store)
    seen_unprotected = 0
    while time.monotonic() - killed_at < 90:
        unprotected, held, open_ = checkpoint_state(server, victim)
        seen_unprotected = max(seen_unprotected, unprotected)
        replaced = not same_actor(server.stores[victim], old_store)
        if replaced and (unprotected, held) == (0, open_):
            break
        time.sleep(0.02)
    recovered_s = time.monotonic() - killed_at
    assert seen_unprotected > 0  # the sessions were unprotected while no store held them
    assert (unprotected, held, open_) == (0, len(mine), len(mine))
    assert recovered_s < 60, recovered_s  # seconds here; most of it is a new worker's start
    new_store = server.stores[victim]
    assert not same_actor(new_store, old_store)
    held_by_new, _ = ray.get(new_store.stats.remote(), timeout=30)
    assert held_by_new == len(mine)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(old_store.stats.remote(), timeout=30)
    # a controller that takes the deployment over (Ray restarted it) supervises the new store,
    # whose name is not the first one's
    taker = Fleet(server.config, server.server.router)
    server.call(taker.adopt())
    assert actor_pid(taker.stores[victim]) == actor_pid(new_store)
    wait_for(
        lambda: (
            exported(server, "session_router_sessions_unprotected", victim) == [0]
            and sum(exported(server, "session_router_sessions_recheckpointed_total", victim))
            >= len(mine)
        ),
        10,
        what="/metrics to show the sessions protected again and count the checkpoints again",
    )

    time.sleep(2.0)  # more turns on the new store
    for load in loads:
        load.stop.set()
    for load in loads:
        load.thread.join(60)
    for load in loads:
        assert not load.errors and not load.unavailable, (load.errors, load.unavailable)
        after = [took for start, took in load.took if start >= killed_at - 1.0]
        assert after and max(after) < slowest_before + SLACK_S, (after, slowest_before)
    server.assert_no_leaks()
    print(
        f"store replaced and {len(mine)} sessions checkpointed again {recovered_s:.2f}s after "
        f"the kill; slowest turn before {slowest_before:.2f}s, after "
        f"{max(t for load in loads for s, t in load.took if s >= killed_at - 1.0):.2f}s"
    )

    # the replica dies now: each of its sessions is restored from the new store's checkpoints
    sigkill(server.replicas[victim])
    for load in loads:
        ids, _, _ = retry_unavailable(load.session.generate, tokens=[7], max_new_tokens=3)
        assert len(ids) == 3
    moved = {load.session.id for load in mine}
    live = server.wait_healed()
    assert victim not in live
    found = set().union(*server.sessions_on(live).values())
    assert moved <= found
    for load in loads:
        assert load.session.close()
    server.wait_at_capacity(live)
    client.close()


def wait_all_checkpointed(server, victim: str, sessions: int, timeout: float, what: str) -> None:
    """Until none of the victim's ``sessions`` is unprotected and its store holds them all."""
    wait_for(
        lambda: checkpoint_state(server, victim) == (0, sessions, sessions), timeout, what=what
    )


def retry_unavailable(generate, attempts: int = 3, **request):
    """Run a turn; the one in flight at a replica's death ends UNAVAILABLE and is retried."""
    for attempt in range(attempts):
        try:
            return drain_stream(generate(**request))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                raise  # ABORTED would mean a session without a checkpoint was lost


def test_a_hung_store_holds_no_turn_up_and_follows_again(server):
    """SIGSTOP of a store: acknowledgements stop but the store is not dead. Turn endings wait
    for their checkpoints at most the hold bound; after the stall bound the replica gives the
    store up (its sessions unprotected); once it runs again (SIGCONT) it follows again and every
    session is checkpointed again."""
    live = server.wait_healed()
    client = SessionClient(server.address)
    loads = [Turns(client, k) for k in range(4)]
    victim = loads[0].session.replica_id
    assert victim in live
    mine = [load for load in loads if load.session.replica_id == victim]
    for load in loads:
        load.thread.start()
    wait_for(lambda: all(len(load.took) >= 2 for load in loads), 120, 0.05, "two turns each")
    wait_all_checkpointed(server, victim, len(mine), 10, "every session of the victim checkpointed")
    slowest_before = max(took for load in loads for _, took in load.took)
    store = server.stores[victim]
    pid = actor_pid(store)

    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: checkpoint_state(server, victim)[0] == len(mine),
            30,
            what="the replica to give the hung store up",
        )
        given_up_s = time.monotonic() - stopped_at
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_all_checkpointed(
        server, victim, len(mine), 30, "the store to follow again and hold every session"
    )
    assert same_actor(server.stores[victim], store)  # the same store, following again
    assert ray.get(store.following.remote(), timeout=30)
    for load in loads:
        load.stop.set()
    for load in loads:
        load.thread.join(60)
    for load in loads:
        assert not load.errors and not load.unavailable, (load.errors, load.unavailable)
        after = [took for start, took in load.took if start >= stopped_at - 1.0]
        assert after and max(after) < slowest_before + HOLD_S + SLACK_S, (after, slowest_before)
    server.assert_no_leaks()
    print(f"hung store given up after {given_up_s:.1f}s")
    for load in loads:
        assert load.session.close()
    server.wait_at_capacity(live)
    client.close()
