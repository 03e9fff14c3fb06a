"""Checkpoints are accounted like slots: a replica actor and the ``CheckpointStore`` that follows
it agree on every checkpoint. Each session's state changes write one, a release frees it, and
the replica's ``checkpoints`` pool (capacity, free, session_held, leaked) says so in every
snapshot; with the failpoint ``leak_checkpoint_on_release`` (a released session's checkpoint is
not freed) the leak shows as ``leaked`` 1, exactly, within moments. A store keeps a session's
whole state and the deltas of its turns, folds them as they pile up, and answers a failover
with one whole state, byte for byte the session's.
"""

from __future__ import annotations

import numpy as np
import ray

from replica.actor import CheckpointStore, remote_replica_actor
from replica.api import PoolSnapshot, PoolStats, SamplingParams
from replica.checkpoints.chain import MAX_DELTAS
from replica.config import PoolConfig, ReplicaConfig
from tests.support.cluster import wait_for
from tests.support.engine import greedy, make_engine, run_turn, token_ids

POOLS = PoolConfig(max_sessions=4, kv_tokens=1024, max_context=256, max_parked_sessions=2)


def replica_with_store(name: str, failpoints: frozenset[str] = frozenset()):
    config = ReplicaConfig(pools=POOLS, failpoints=failpoints, threads=1)
    replica = remote_replica_actor().options(num_cpus=0).remote(name, config)
    node = ray.get(replica.describe.remote(), timeout=120).node_id
    store = ray.remote(CheckpointStore).options(num_cpus=0).remote(name)
    ray.get(store.follow.remote(replica, node))
    return replica, store


def snapshot(replica) -> PoolSnapshot:
    snap = ray.get(replica.snapshot.remote(True), timeout=30)
    assert isinstance(snap, PoolSnapshot), snap
    return snap


def checkpoints_pool(replica) -> tuple[int, int, int, int]:
    """(capacity, free, session_held, leaked) of the replica's checkpoints pool, exactly."""
    snap = ray.get(replica.snapshot.remote(True), timeout=30)
    assert isinstance(snap, PoolSnapshot), snap
    pool = snap.pool("checkpoints")
    return pool.capacity, pool.free, pool.session_held, pool.leaked


def test_checkpoints_are_written_freed_and_a_leaked_one_shows(ray_cluster):
    replicas = {
        "plain": replica_with_store("ckpt-plain"),
        "leaky": replica_with_store("ckpt-leaky", frozenset({"leak_checkpoint_on_release"})),
    }
    for replica, store in replicas.values():
        wait_for(lambda r=replica: checkpoints_pool(r) == (6, 6, 0, 0), 30, 0.05, "a store")
        for sid in ("a", "b"):
            ray.get(replica.open_session.remote(sid))
        wait_for(lambda r=replica: snapshot(r).open_sessions == 2, 30, 0.05, "2 opened")
        assert checkpoints_pool(replica) == (6, 6, 0, 0)  # opened empty: nothing to lose yet
        for sid in ("a", "b"):
            turn = replica.submit_turn.remote("", sid, None, [5, 6, 7], SamplingParams(4))
            assert isinstance(ray.get(turn), int)
        wait_for(lambda r=replica: checkpoints_pool(r) == (6, 4, 2, 0), 30, 0.05, "2 written")
        assert ray.get(store.stats.remote())[0] == 2
        closed = ray.get(replica.close_sessions.remote(["a"]))
        assert closed.was_open == (True,)

    plain_replica, plain_store = replicas["plain"]
    wait_for(lambda: checkpoints_pool(plain_replica) == (6, 5, 1, 0), 30, 0.05, "a freed")
    assert ray.get(plain_store.stats.remote())[0] == 1

    leaky_replica, leaky_store = replicas["leaky"]  # "a" is released, its checkpoint is not
    wait_for(lambda: checkpoints_pool(leaky_replica) == (6, 4, 1, 1), 30, 0.05, "the leak")
    assert ray.get(leaky_store.stats.remote())[0] == 2

    for replica, store in replicas.values():
        ray.get(replica.close_sessions.remote(["b"]))
        ray.kill(replica)
        ray.kill(store)


def test_an_acknowledgement_that_fails_is_sent_again(ray_cluster):
    """The acknowledgement after a drop is the replica's only news of it: one that fails while
    the replica lives (``checkpoint_ack_fails``: the call raises) is sent again, so the freed
    checkpoint shows free within moments instead of held until some later turn."""
    replica, store = replica_with_store("ckpt-ack-fails")
    wait_for(lambda: checkpoints_pool(replica) == (6, 6, 0, 0), 30, 0.05, "a store")
    ray.get(replica.open_session.remote("a"))
    turn = replica.submit_turn.remote("", "a", None, [5, 6, 7], SamplingParams(4))
    assert isinstance(ray.get(turn), int)
    wait_for(lambda: checkpoints_pool(replica) == (6, 5, 1, 0), 30, 0.05, "a written")
    arm = replica.__ray_call__.remote(
        lambda actor: actor.checkpoints.call_faults.arm("checkpoint_ack_fails")
    )
    ray.get(arm)
    assert ray.get(replica.close_sessions.remote(["a"])).was_open == (True,)
    wait_for(lambda: checkpoints_pool(replica) == (6, 6, 0, 0), 10, 0.05, "the drop acknowledged")
    fired = replica.__ray_call__.remote(
        lambda actor: not actor.checkpoints.call_faults.fires("checkpoint_ack_fails")
    )
    assert ray.get(fired), "the acknowledgement after the drop did not fail: nothing was tested"
    assert ray.get(store.stats.remote())[0] == 0
    ray.kill(replica)
    ray.kill(store)


def test_the_checkpoints_pool_is_in_every_snapshot_from_the_first():
    """Before a store has connected (or after it went), no checkpoint of the replica is stored
    anywhere: the pool shows every slot free, so dashboards never see it come and go."""
    engine = make_engine(POOLS)
    assert engine.snapshot().pool("checkpoints") == PoolStats("checkpoints", 6, 6, 0, 0)
    unchecked = make_engine(POOLS, session_checkpoints=False)
    assert "checkpoints" not in {p.pool for p in unchecked.snapshot().pools}


def test_a_store_folds_deltas_and_answers_a_failover_with_the_whole_state(ray_cluster):
    replica, store = replica_with_store("ckpt-chain")
    wait_for(lambda: checkpoints_pool(replica) == (6, 6, 0, 0), 30, 0.05, "a store")
    unmoved = make_engine(POOLS)  # the same built-in model, the same turns, in this process
    ray.get(replica.open_session.remote("a"))
    unmoved.open_session("a")
    for turn in range(MAX_DELTAS + 4):
        ids = token_ids(6 + turn, turn)
        written = snapshot(replica).checkpoints.written_total
        ray.get(replica.submit_turn.remote("", "a", None, ids, greedy(4)))
        run_turn(unmoved, "a", ids, greedy(4))
        wait_for(
            lambda written=written: (
                snapshot(replica).checkpoints.written_total == written + 1
                and checkpoints_pool(replica) == (6, 5, 1, 0)
            ),
            30,
            0.05,
            "the turn's checkpoint stored",
        )
    totals = snapshot(replica).checkpoints
    held, held_bytes = ray.get(store.stats.remote())
    assert held == 1 and held_bytes < totals.bytes_written_total  # deltas were folded

    ((meta, (ref,)),) = ray.get(store.checkpoints.remote(["a"], 0.0)).values()
    record = ray.get(ref)
    assert meta.kv_from == 0 and record.sessions[0].committed_len == meta.committed_len
    want = unmoved.transfer.export([unmoved.sessions.get("a")])
    assert record.sessions == want.sessions
    for got, expected in zip(
        (record.conv, record.ssm, record.k, record.v), (want.conv, want.ssm, want.k, want.v)
    ):
        assert np.array_equal(got, expected)
    ray.get(replica.close_sessions.remote(["a"]))
    wait_for(lambda: checkpoints_pool(replica) == (6, 6, 0, 0), 30, 0.05, "freed")
    assert ray.get(store.stats.remote()) == (0, 0)
    ray.kill(replica)
    ray.kill(store)


def test_a_fenced_store_keeps_its_checkpoints_whatever_the_replica_releases(ray_cluster):
    """A replica declared dead may be alive (stopped, then continued) and release its sessions
    (idle timeouts); once the failover has fenced its store, those releases reach the store and
    free nothing there, so the failover reads every checkpoint held when the replica was
    declared dead. Before the fence a release frees its checkpoint as always."""
    replica, store = replica_with_store("ckpt-fenced")
    wait_for(lambda: checkpoints_pool(replica) == (6, 6, 0, 0), 30, 0.05, "a store")
    for sid in ("a", "b"):
        ray.get(replica.open_session.remote(sid))
        turn = replica.submit_turn.remote("", sid, None, [5, 6, 7], SamplingParams(4))
        assert isinstance(ray.get(turn), int)
    wait_for(lambda: checkpoints_pool(replica) == (6, 4, 2, 0), 30, 0.05, "2 written")
    ray.get(replica.close_sessions.remote(["a"]))
    wait_for(lambda: ray.get(store.stats.remote())[0] == 1, 30, 0.05, "a's checkpoint freed")

    ray.get(store.fence.remote())
    ray.get(replica.close_sessions.remote(["b"]))
    # the drop went through the stream (acknowledged: the replica expects none now) and the
    # store kept b's checkpoint, for the failover: no leak of the replica's (its engine, strict,
    # would die of one), and the store says it holds it
    wait_for(lambda: checkpoints_pool(replica) == (6, 6, 0, 0), 30, 0.05, "b's drop taken")
    assert ray.get(store.stats.remote())[0] == 1
    assert isinstance(ray.get(replica.check_invariant.remote()), PoolSnapshot)
    found = ray.get(store.checkpoints.remote(["a", "b"], 0.5), timeout=30)
    assert set(found) == {"b"}
    meta, _ = found["b"]
    assert meta.session_id == "b" and meta.committed_len > 0
    ray.kill(replica)
    ray.kill(store)
