"""End to end: moves of sessions whose other side fails part-way (issue 19). Each test makes one
fault happen, deterministically (a failpoint armed on one live replica, or a SIGKILL at a known
step), then checks that no session is lost or doubled (held by exactly one live replica, the one
the router pins it to), that it continues from where it was, that the right status comes back,
that the side that failed is blamed and a healthy one stays healthy, and that nothing leaked
(every pool of the survivors, checkpoints included, back at capacity).

- the target's import raises (``import_fails``): INTERNAL, the session stays on the source;
- the source's release of a session that landed raises (``finish_export_fails``): INTERNAL, the
  target gives its copy back, the session stays on the source;
- the target dies with the sessions in its pools (``import_crashes``): UNAVAILABLE, the session
  stays on the source;
- the source dies as it releases a session that landed (``finish_export_crashes``): the move
  succeeds, the target's copy is the only one;
- the target's import stalls while the router declares it dead (``import_stalls``): the
  session is not pinned to the dead target, the move fails UNAVAILABLE, the session stays on
  the source;
- a replica dies during a drain that waits for its session's turn, and the failover's first
  target dies importing it: the session is restored on the third replica from its checkpoint,
  and the drain answers from the failover's outcome (DEAD, 1 migrated, 0 left).

The replicas are killed, so the module has its own server, of three replicas.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc
import pytest
import ray

from protos import session_router_pb2 as pb
from router.client import Session, SessionClient
from router.control.api import ReplicaHealth
from tests.support.cluster import drain_stream, rpc_error, tokens, wait_for
from tests.support.servers import grpc_client, serve_cluster


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(replicas=3, stale_after_s=3.0) as srv:
        yield srv


@pytest.fixture
def client(server):
    with grpc_client(server.address) as c:
        yield c


def views(server) -> dict:
    return {v.replica_id: v for v in ray.get(server.server.router.views.remote(), timeout=30)}


def live(server) -> list[str]:
    return sorted(r for r, v in views(server).items() if v.health == ReplicaHealth.HEALTHY)


def arm(server, replica_id: str, fault: str) -> None:
    """Arm the counted failpoint ``fault`` on one live replica: it fires once, next time."""
    handle = server.replicas[replica_id]
    armed = handle.__ray_call__.remote(lambda actor: actor.moves.call_faults.arm(fault))
    ray.get(armed, timeout=30)


def turn(session, seed: int, n_new: int = 3) -> int:
    """One turn to its end; the session's committed tokens after it."""
    ids, reason, committed = drain_stream(
        session.generate(tokens=tokens(seed, 4), max_new_tokens=n_new, timeout=60)
    )
    assert (len(ids), reason) == (n_new, pb.FINISH_REASON_LENGTH)
    return committed


def assert_one_copy(server, session_id: str, replica_id: str) -> None:
    """The session is held by ``replica_id`` alone among the live replicas, and pinned there."""
    alive = live(server)
    holders = {r for r, held in server.sessions_on(alive).items() if session_id in held}
    assert holders == {replica_id}, f"{session_id[:12]} held by {holders}, not {replica_id}"
    router = server.server.router
    pins = ray.get([router.pinned_sessions.remote(r) for r in views(server)], timeout=30)
    pinned = {r for r, ids in zip(views(server), pins) if session_id in ids}
    assert pinned == {replica_id}, f"{session_id[:12]} pinned to {pinned}"


def new_errors(server, before: dict, replica_id: str) -> dict[tuple[str, str], int]:
    """The router's calls to ``replica_id`` that failed since ``before`` (views), by kind."""
    now, was = views(server)[replica_id].call_errors, before[replica_id].call_errors
    return {k: n - was.get(k, 0) for k, n in now.items() if n != was.get(k, 0)}


def wait_dead(server, replica_id: str) -> None:
    def dead() -> bool:
        view = views(server).get(replica_id)
        return view is None or view.health == ReplicaHealth.DEAD

    wait_for(dead, 30, 0.1, f"{replica_id} to be DEAD")


def pair(server, client: SessionClient):
    """A session with one ended turn (so a checkpoint), its replica, and another live one."""
    alive = wait_for(lambda: live(server)[1:] and live(server), 120, 0.2, "2 live replicas")
    session = client.open()
    committed = turn(session, 1)
    return session, committed, session.replica_id, next(r for r in alive if r != session.replica_id)


def close_and_check(server, sessions) -> None:
    for s in sessions:
        assert s.close() is True
    server.wait_at_capacity(live(server))


@dataclass
class Move:
    """A migration of a session (with one ended turn) made with a fault armed on one side."""

    session: Session
    committed: int  # its committed tokens before the move
    source: str
    target: str
    before: dict  # the router's views before the move
    outcome: pb.Session | grpc.RpcError

    def goes_on_at(self, server, holder: str, seed: int) -> None:
        """Held by ``holder`` alone and pinned there; its next turn continues from where it
        was; ``holder`` is healthy and blamed for nothing."""
        assert_one_copy(server, self.session.id, holder)
        assert turn(self.session, seed) == self.committed + 7
        assert views(server)[holder].health == ReplicaHealth.HEALTHY
        if holder == self.source:
            assert not new_errors(server, self.before, holder)


def move_with(server, client: SessionClient, fault: str, on_source: bool) -> Move:
    session, committed, source, target = pair(server, client)
    before = views(server)
    arm(server, source if on_source else target, fault)
    try:
        outcome: pb.Session | grpc.RpcError = client.migrate(session.id, target, 60)
    except grpc.RpcError as err:
        outcome = err
    return Move(session, committed, source, target, before, outcome)


def test_an_import_that_raises_on_the_target_leaves_the_session_on_the_source(server, client):
    move = move_with(server, client, "import_fails", on_source=False)
    err, target = move.outcome, move.target
    assert err.code() == grpc.StatusCode.INTERNAL, err
    assert "import_sessions" in err.details() and target in err.details(), err.details()
    move.goes_on_at(server, move.source, 2)
    assert views(server)[target].health == ReplicaHealth.HEALTHY
    assert new_errors(server, move.before, target) == {("import_sessions", "application"): 1}
    # the fault fired once: the same move now succeeds, and the session goes on there
    assert client.migrate(move.session.id, target, 60).replica_id == target
    assert_one_copy(server, move.session.id, target)
    assert turn(move.session, 3) == move.committed + 14
    close_and_check(server, [move.session])


def test_a_release_that_raises_on_the_source_keeps_only_the_source_copy(server, client):
    move = move_with(server, client, "finish_export_fails", on_source=True)
    err, source = move.outcome, move.source
    assert err.code() == grpc.StatusCode.INTERNAL, err
    assert "finish_export" in err.details() and source in err.details(), err.details()
    assert_one_copy(server, move.session.id, source)  # the target gave its copy back
    assert turn(move.session, 4) == move.committed + 7
    states = views(server)
    assert states[move.target].health == states[source].health == ReplicaHealth.HEALTHY
    assert new_errors(server, move.before, source) == {("finish_export", "application"): 1}
    assert not new_errors(server, move.before, move.target)
    close_and_check(server, [move.session])


def test_a_target_that_dies_mid_import_leaves_the_session_on_the_source(server, client):
    move = move_with(server, client, "import_crashes", on_source=False)
    assert move.outcome.code() == grpc.StatusCode.UNAVAILABLE, move.outcome
    assert move.target in move.outcome.details(), move.outcome.details()
    wait_dead(server, move.target)
    move.goes_on_at(server, move.source, 5)
    close_and_check(server, [move.session])


def test_a_source_that_dies_releasing_a_landed_session_leaves_the_target_copy(server, client):
    move = move_with(server, client, "finish_export_crashes", on_source=True)
    assert (move.outcome.replica_id, move.outcome.committed_tokens) == (
        move.target,
        move.committed,
    )
    wait_dead(server, move.source)
    move.goes_on_at(server, move.target, 6)
    assert not new_errors(server, move.before, move.target)
    close_and_check(server, [move.session])


def test_a_target_declared_dead_mid_import_gets_no_pin(server, client):
    """The target's import stalls (``import_stalls``) while the router declares the target dead,
    then answers that the session landed: nothing is pinned to the dead target, the migration
    fails UNAVAILABLE naming it, and the session goes on at its source, its one live copy."""
    session, committed, source, target = pair(server, client)
    arm(server, target, "import_stalls")
    moved: dict[str, grpc.RpcError | pb.Session] = {}

    def migrate() -> None:
        try:
            moved["r"] = client.migrate(session.id, target, 60)
        except grpc.RpcError as err:
            moved["r"] = err

    mover = threading.Thread(target=migrate)
    mover.start()
    stalls = server.replicas[target].__ray_call__
    wait_for(
        lambda: ray.get(stalls.remote(lambda a: a.moves.call_faults.stalled), timeout=30),
        30,
        0.05,
        "the import to stall on the target",
    )
    router = server.server.router
    ray.get(router.replica_failed.remote(target, "declared dead mid-import (test)", False))
    mover.join(60)
    err = moved["r"]
    assert isinstance(err, grpc.RpcError), f"the move landed on a dead target: {err}"
    assert err.code() == grpc.StatusCode.UNAVAILABLE and target in err.details(), err
    pins = ray.get(router.pinned_sessions.remote(target), timeout=30)
    assert session.id not in pins
    assert_one_copy(server, session.id, source)
    assert turn(session, 10) == committed + 7
    assert views(server)[source].health == ReplicaHealth.HEALTHY
    close_and_check(server, [session])


def test_a_session_ended_by_its_idle_timeout_on_the_target_before_its_pin_is_pinned_nowhere(
    server, client
):
    """The target's import stalls (``import_stalls``, 8 s) past the session's idle timeout
    (2 s): the target releases its copy on its own and tells the router, and the source lets
    its own go as the import answers. The session has ended (NOT_FOUND), the router pins it
    nowhere and every pool is free; before, the move pinned it to the target, which held
    nothing, and the pin stayed for good (a ``bench.chaos`` end state)."""
    alive = wait_for(lambda: live(server)[1:] and live(server), 120, 0.2, "2 live replicas")
    session = client.open(idle_timeout_s=2.0)
    turn(session, 1)
    source = session.replica_id
    target = next(r for r in alive if r != source)
    arm(server, target, "import_stalls")
    try:
        moved = client.migrate(session.id, target, 60)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND, err
    else:
        raise AssertionError(f"the move pinned a session its target released: {moved}")
    router = server.server.router
    pins = ray.get([router.pinned_sessions.remote(r) for r in views(server)], timeout=30)
    assert not any(session.id in ids for ids in pins), "a session nobody holds is pinned"
    assert not any(session.id in held for held in server.sessions_on(live(server)).values())
    err = rpc_error(client.sessions.GetSession, pb.GetSessionRequest(session_id=session.id))
    assert err.code() == grpc.StatusCode.NOT_FOUND, err
    server.wait_at_capacity(live(server))


def test_a_drain_whose_replica_dies_and_whose_failover_target_dies_importing(server, client):
    victim, first, third = server.wait_healed(180)[:3]
    session = client.open()
    if session.replica_id != victim:
        client.migrate(session.id, victim, 60)
    committed = turn(session, 7)
    padding = [client.open() for _ in range(2)]  # the third replica has less room: the
    for p in padding:  # failover's first choice is the one armed to die
        if p.replica_id != third:
            client.migrate(p.id, third, 60)
    arm(server, first, "import_crashes")

    stream = session.generate(tokens=tokens(8, 4), max_new_tokens=400, timeout=120)
    next(stream)  # the turn runs: the drain waits for its end
    drained: dict[str, pb.DrainReplicaResponse] = {}
    drain = threading.Thread(target=lambda: drained.update(r=client.drain(victim, True, 120)))
    drain.start()
    moving = server.server.router.__ray_call__
    wait_for(
        lambda: ray.get(moving.remote(lambda r: r.migrator.claims.moving.get(victim, 0))),
        30,
        0.02,
        "the drain to claim the session",
    )
    server.sigkill_replica(victim)
    err = rpc_error(lambda: list(stream))
    assert err.code() == grpc.StatusCode.UNAVAILABLE, err  # the turn died with its replica
    drain.join(120)
    answer = drained["r"]
    assert answer.replica.state == pb.REPLICA_STATE_DEAD, answer
    assert (answer.sessions_migrated, answer.sessions_left) == (1, 0), answer
    wait_dead(server, first)
    assert_one_copy(server, session.id, third)
    assert turn(session, 9) == committed + 7  # from its checkpoint: the killed turn is undone
    assert views(server)[third].health == ReplicaHealth.HEALTHY
    close_and_check(server, [session, *padding])
