"""End to end: live migration through gRPC. MigrateSession moves a session (idle, or once its
running turn ends) and it continues exactly as its never-moved twin; DrainReplica(migrate=true)
under load moves every session off a replica while their turns run, without a failed turn or a
lost session, leaving the replica empty with every pool at capacity; the races (a close during a
move, a move during a close, two moves of one session) end consistent and leak nothing; and the
operator's ``session-router drain`` / ``resume`` commands.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from replica.api import ActorError, SamplingParams, StatusCode
from router.client import SessionClient
from router.ops import cli
from tests.support.cluster import drain_stream, wait_for
from tests.support.servers import grpc_client, serve_cluster

SEEDED = dict(temperature=0.8, top_p=0.95, seed=77)


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(max_parked_sessions=4) as srv:
        yield srv


@pytest.fixture
def client(server):
    with grpc_client(server.address) as c:
        yield c
    for replica_id in server.replicas:  # every test leaves the replicas as it found them
        c = SessionClient(server.address)
        c.resume(replica_id)
        c.close()


def tokens(seed: int, n: int = 6) -> list[int]:
    return [(seed * 37 + i * 11) % 250 + 1 for i in range(n)]


def turn(session, seed: int, n_new: int = 4) -> tuple[list[int], int]:
    ids, reason, committed = drain_stream(
        session.generate(tokens=tokens(seed), max_new_tokens=n_new, **SEEDED)
    )
    assert reason == pb.FINISH_REASON_LENGTH
    return ids, committed


def other_replica(server, replica_id: str) -> str:
    return next(r for r in server.replicas if r != replica_id)


def test_a_migrated_session_continues_exactly_like_its_twin(server, client):
    moved, twin = client.open(), client.open()
    for seed in (1, 2):
        assert turn(moved, seed) == turn(twin, seed)
    target = other_replica(server, moved.replica_id)
    info = client.migrate(moved.id, target)
    assert (info.replica_id, info.committed_tokens) == (target, 20)
    assert server.sessions_on([target])[target] >= {moved.id}
    source = other_replica(server, target)
    assert moved.id not in server.sessions_on([source])[source]
    info = client.migrate(moved.id)  # placement chooses: any replica but the one it is on
    assert info.replica_id == source
    for seed in (3, 4):
        assert turn(moved, seed) == turn(twin, seed)
    assert moved.close() and twin.close()
    server.assert_no_leaks()


def test_a_session_whose_turn_runs_moves_when_the_turn_ends(server, client):
    moving, twin = client.open(), client.open()
    assert turn(moving, 5) == turn(twin, 5)
    stream = moving.generate(tokens=tokens(6), max_new_tokens=48, **SEEDED)
    first = next(stream)
    with ThreadPoolExecutor(1) as pool:
        migrated = pool.submit(client.migrate, moving.id, "", 60)
        rest, reason, committed = drain_stream(stream)  # the turn runs to its end where it began
        info = migrated.result(timeout=60)
    ids = list(first.token_ids) + rest
    assert (ids, reason) == drain_stream(
        twin.generate(tokens=tokens(6), max_new_tokens=48, **SEEDED)
    )[:2]
    assert info.replica_id != moving.replica_id and info.committed_tokens == committed
    assert turn(moving, 7) == turn(twin, 7)
    assert moving.close() and twin.close()
    server.assert_no_leaks()


def test_drain_with_migration_under_load(server, client):
    sessions = [client.open() for _ in range(8)]
    victim = sessions[0].replica_id
    on_victim = {s.id for s in sessions if s.replica_id == victim}
    history: dict[str, list[tuple[int, list[int], int]]] = {s.id: [] for s in sessions}
    errors: list[grpc.RpcError] = []
    stop = threading.Event()

    def load(k: int, session) -> None:
        n = 0
        while not stop.is_set() or n < 3:
            seed = 100 * k + n
            try:
                ids, committed = turn(session, seed, n_new=6)
            except grpc.RpcError as exc:
                errors.append(exc)
                return
            history[session.id].append((seed, ids, committed))
            n += 1

    threads = [threading.Thread(target=load, args=(k, s)) for k, s in enumerate(sessions)]
    for t in threads:
        t.start()
    wait_for(lambda: all(history.values()), 60, 0.05, "every session's first turn")
    before = _migrated(server, victim, "drain")
    drained = client.drain(victim, migrate=True, timeout=120)
    stop.set()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert drained.sessions_left == 0 and drained.sessions_migrated == len(on_victim)
    assert drained.replica.state == pb.REPLICA_STATE_DRAINING
    server.wait_at_capacity([victim])
    (survivor,) = set(server.replicas) - {victim}
    assert server.sessions_on([survivor])[survivor] >= {s.id for s in sessions}
    assert _migrated(server, victim, "drain") == before + len(on_victim)

    # every session lost nothing: each turn continued from the last, exactly as a session
    # that never moved (a fresh one replaying the same turns) does
    for s in sessions:
        turns = history[s.id]
        assert [c for _, _, c in turns] == [12 * (i + 1) for i in range(len(turns))]
        replay = client.open()
        assert replay.replica_id == survivor
        for seed, ids, _ in turns:
            assert turn(replay, seed, n_new=6)[0] == ids
        assert replay.close() and s.close()
    server.assert_no_leaks()


def test_a_close_during_a_move_closes_the_session_where_it_lands(server, client):
    session = client.open()
    stream = session.generate(tokens=tokens(9), max_new_tokens=40)
    next(stream)
    with ThreadPoolExecutor(2) as pool:
        migrated = pool.submit(_migrate_or_code, client, session.id)
        wait_for(lambda: _moving(server, session), 30, 0.01, "the move to begin")
        closed = pool.submit(session.close)  # the source refuses it: the gateway follows
        assert drain_stream(stream)[1] == pb.FINISH_REASON_LENGTH  # the turn ran to its end
        assert closed.result(60) is True
        # the move landed; the close, which waited for it, may end the session before the
        # move's answer reads it back
        assert migrated.result(60) in ("moved", grpc.StatusCode.NOT_FOUND)
    assert all(session.id not in held for held in server.sessions_on().values())
    assert not session.close()
    server.wait_at_capacity()


def test_moves_and_closes_of_the_same_sessions_race_to_a_consistent_end(server, client):
    sessions = [client.open() for _ in range(6)]
    for n, s in enumerate(sessions):
        turn(s, n)
    with ThreadPoolExecutor(12) as pool:
        moves = [pool.submit(_migrate_or_code, client, s.id) for s in sessions]
        closes = [pool.submit(s.close) for s in sessions]
        assert all(c.result(60) is True for c in closes)
        assert {m.result(60) for m in moves} <= {"moved", grpc.StatusCode.NOT_FOUND}
    assert not any(server.sessions_on().values())
    server.wait_at_capacity()


def test_two_moves_of_one_session_run_one_after_the_other(server, client):
    session, twin = client.open(), client.open()
    assert turn(session, 11) == turn(twin, 11)
    before = sum(_migrated(server, r, "admin") for r in server.replicas)
    with ThreadPoolExecutor(2) as pool:
        infos = [f.result(60) for f in [pool.submit(client.migrate, session.id) for _ in "ab"]]
    assert sum(_migrated(server, r, "admin") for r in server.replicas) == before + 2
    held = [r for r, ids in server.sessions_on().items() if session.id in ids]
    assert held == [session.replica_id]  # there, then back: each answer says where it is now
    assert held[0] in {i.replica_id for i in infos}
    assert turn(session, 12) == turn(twin, 12)
    assert session.close() and twin.close()
    server.wait_at_capacity()


def test_the_drain_and_resume_commands(server, client):
    session = client.open()
    turn(session, 13)
    victim, out = session.replica_id, io.StringIO()
    args = ["drain", "--grpc", server.address, "--replica", victim, "--migrate"]
    with contextlib.redirect_stdout(out):
        assert cli.main([*args, "--timeout-s", "60"]) == 0
        assert cli.main(["resume", "--grpc", server.address, "--replica", victim]) == 0
    assert f"{victim}: draining; 1 sessions migrated, 0 left" in out.getvalue()
    assert f"{victim}: REPLICA_STATE_HEALTHY" in out.getvalue()
    assert (
        session.id
        in server.sessions_on([other_replica(server, victim)])[other_replica(server, victim)]
    )

    # --this-node, as a preStop hook runs it: this test's Ray has one node, so every replica
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    done = subprocess.run(
        [sys.executable, "-m", "router.ops.cli", "drain", "--grpc", server.address, "--this-node"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(line.split(":")[0] for line in done.stdout.splitlines()) == sorted(
        server.replicas
    )
    assert {r.state for r in client.replicas()} == {pb.REPLICA_STATE_DRAINING}
    assert session.close()


def _moving(server, session) -> bool:
    """Whether the session's replica has marked it moving: a turn submitted there straight
    (while its turn runs) is refused UNAVAILABLE, not FAILED_PRECONDITION."""
    handle = server.replicas[session.replica_id]
    refused = ray.get(handle.submit_turn.remote("", session.id, None, [1], SamplingParams()))
    assert isinstance(refused, ActorError), refused
    return refused.code == StatusCode.UNAVAILABLE


def _migrated(server, replica_id: str, reason: str) -> int:
    views = {v.replica_id: v for v in ray.get(server.server.router.views.remote())}
    return views[replica_id].sessions_migrated.get(reason, 0)


def _migrate_or_code(client: SessionClient, session_id: str):
    try:
        client.migrate(session_id, "", 60)
    except grpc.RpcError as exc:
        return exc.code()
    return "moved"
