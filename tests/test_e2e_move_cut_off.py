"""End to end: the router dies in the middle of a move, after the import landed on the target
and before the source released its copy (failpoint ``import_stalls`` holds the target's answer
while the session is already open in its pools).

Ray restarts the router with empty tables; both replicas register the session, the source
marking it moving. The new router keeps one copy, the target's (the move had landed), and has
the source release its own: within seconds exactly one replica holds the session, the router
pins it there, and its next turn equals a session's that never moved; nothing is left held.
(Before, the router pinned whichever registered last: the source's copy refused its turns, as
marked moving, for the mark's two minutes, or the target's copy stayed beside it unused.)

The test kills the router, so the module has its own server.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
import ray

from router.client import SessionClient
from tests.support.cluster import actor_pid, drain_stream, wait_for
from tests.support.servers import serve_cluster

SEEDED = dict(temperature=0.7, seed=11)


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster(stale_after_s=3.0) as srv:
        yield srv


def test_a_move_cut_off_by_the_routers_death_leaves_one_copy(server):
    client = SessionClient(server.address)
    moved, other = client.open(idle_timeout_s=240), client.open(idle_timeout_s=240)
    source = moved.replica_id
    target = next(r for r in server.wait_healed() if r != source)
    first = drain_stream(moved.generate(tokens=[4, 5, 6], max_new_tokens=6, **SEEDED))

    handle = server.replicas[target]
    armed = handle.__ray_call__.remote(lambda actor: actor.moves.call_faults.arm("import_stalls"))
    ray.get(armed, timeout=30)
    outcome: list = []

    def migrate() -> None:
        try:
            outcome.append(client.migrate(moved.id, target, 60))
        except Exception as exc:  # noqa: BLE001 - the router died under it: either is fine
            outcome.append(exc)

    mover = threading.Thread(target=migrate)
    mover.start()
    wait_for(
        lambda: moved.id in server.sessions_on([target])[target],
        30,
        0.05,
        "the import to land in the target's pools",
    )
    router = server.server.router
    pid = actor_pid(router)
    os.kill(pid, signal.SIGKILL)

    def one_copy() -> str | None:
        held = server.sessions_on([source, target])
        holders = [r for r, sessions in held.items() if moved.id in sessions]
        try:
            pinned = ray.get(router.pinned_sessions.remote(target), timeout=5)
        except ray.exceptions.RayError:
            return None  # the router is still restarting
        return holders[0] if holders == [target] and moved.id in pinned else None

    wait_for(one_copy, 45, 0.2, "one copy, on the target, pinned there")
    mover.join(timeout=90)
    assert outcome, "the migrate call never ended"

    went_on = drain_stream(moved.generate(tokens=[7, 8], max_new_tokens=6, **SEEDED))
    fresh = client.open()
    assert drain_stream(fresh.generate(tokens=[4, 5, 6], max_new_tokens=6, **SEEDED)) == first
    assert drain_stream(fresh.generate(tokens=[7, 8], max_new_tokens=6, **SEEDED)) == went_on
    for s in (moved, other, fresh):
        assert s.close()
    server.wait_at_capacity(server.wait_healed())
    client.close()


def test_a_move_cut_off_before_it_landed_leaves_the_session_on_its_source(server):
    """The router marked the session moving on its source (as a move's first step) and died:
    the new router has the source take it back once every replica has registered, so its turns
    go on there at once (before, they were refused as moving for the mark's two minutes)."""
    client = SessionClient(server.address)
    server.wait_healed()
    session = client.open(idle_timeout_s=240)
    first = drain_stream(session.generate(tokens=[4, 5, 6], max_new_tokens=6, **SEEDED))
    handle = server.replicas[session.replica_id]
    ray.get(handle.mark_moving.remote([session.id]), timeout=30)
    router = server.server.router
    pid = actor_pid(router)
    os.kill(pid, signal.SIGKILL)

    went_on = drain_stream(session.generate(tokens=[7, 8], max_new_tokens=6, timeout=60, **SEEDED))
    assert server.sessions_on()[session.replica_id] >= {session.id}
    fresh = client.open()
    assert drain_stream(fresh.generate(tokens=[4, 5, 6], max_new_tokens=6, **SEEDED)) == first
    assert drain_stream(fresh.generate(tokens=[7, 8], max_new_tokens=6, **SEEDED)) == went_on
    for s in (session, fresh):
        assert s.close()
    server.wait_at_capacity(server.wait_healed())
    client.close()
