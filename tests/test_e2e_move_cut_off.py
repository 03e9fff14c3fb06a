"""End to end: the router dies in the middle of a move, after the import landed on the target
and before the source released its copy (failpoint ``import_stalls`` holds the target's answer
while the session is already open in its pools).

Ray restarts the router with empty tables; both replicas register the session, the source
marking it moving. The new router keeps one copy, the target's (the move had landed), and has
the source release its own: within seconds exactly one replica holds the session, the router
pins it there, and its next turn equals a session's that never moved; nothing is left held.
(Before, the router pinned whichever registered last: the source's copy refused its turns, as
marked moving, for the mark's two minutes, or the target's copy stayed beside it unused.)

A move cut off before it landed, whose import lands only after the target has registered
with the restarted router (failpoint ``import_lands_late`` holds it until then), is refused:
the new router learned the target's sessions without it, so its copy would be pinned nowhere
until its idle timeout. One copy is left, pinned where it is (on the source, or on the target
when the gateway's retry of the migrate call moved it on the new router).

The tests kill the router, so the module has its own server.
"""

from __future__ import annotations

import os
import signal
import threading
import time

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
    _goes_on_as_if_it_never_moved(server, client, first, went_on, moved, other)


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
    _goes_on_as_if_it_never_moved(server, client, first, went_on, session)


def test_a_cut_off_move_landing_after_the_new_router_learned_its_target_is_refused(server):
    client = SessionClient(server.address)
    session = client.open(idle_timeout_s=240)
    source = session.replica_id
    target = next(r for r in server.wait_healed() if r != source)
    first = drain_stream(session.generate(tokens=[4, 5, 6], max_new_tokens=6, **SEEDED))
    handle = server.replicas[target]

    def on_target(fn):
        return ray.get(handle.__ray_call__.remote(fn), timeout=30)

    stalled = on_target(lambda actor: actor.moves.call_faults.stalled)
    on_target(lambda actor: actor.moves.call_faults.arm("import_lands_late"))
    old_router = on_target(lambda actor: actor.reporter.router_incarnation)
    mover = threading.Thread(target=lambda: _migrate(client, session.id, target))
    mover.start()
    wait_for(
        lambda: on_target(lambda actor: actor.moves.call_faults.stalled) > stalled,
        30,
        0.05,
        "the import to wait before it lands",
    )
    router = server.server.router
    os.kill(actor_pid(router), signal.SIGKILL)
    wait_for(
        lambda: on_target(lambda actor: actor.reporter.router_incarnation) != old_router,
        60,
        0.1,
        "the target to report to the restarted router",
    )
    mover.join(timeout=90)
    assert not mover.is_alive(), "the migrate call never ended"

    def one_copy() -> str | None:
        """The one replica that holds the session, when the router pins it there."""
        held = server.sessions_on([source, target])
        holders = [r for r, sessions in held.items() if session.id in sessions]
        if len(holders) != 1:
            return None
        try:
            pinned = ray.get(router.pinned_sessions.remote(holders[0]), timeout=5)
        except ray.exceptions.RayError:
            return None  # the router is still restarting
        return holders[0] if session.id in pinned else None

    # the held import is refused; the gateway's retry of the migrate call may move the session
    # on the new router meanwhile (a move of its own): either way, one copy, pinned there
    holder = wait_for(one_copy, 45, 0.2, "one copy, pinned where it is")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert one_copy() == holder, "a second copy appeared: the late import landed"
        time.sleep(0.2)
    went_on = drain_stream(session.generate(tokens=[7, 8], max_new_tokens=6, timeout=60, **SEEDED))
    _goes_on_as_if_it_never_moved(server, client, first, went_on, session)


def _migrate(client: SessionClient, session_id: str, target: str) -> None:
    try:
        client.migrate(session_id, target, 60)
    except Exception:  # noqa: BLE001 - the router died under it: the move is void
        pass


def _goes_on_as_if_it_never_moved(server, client, first, went_on, *sessions) -> None:
    """A fresh session given the same two turns streams ``first`` and ``went_on``; then every
    session closes and every pool is back at capacity."""
    fresh = client.open()
    assert drain_stream(fresh.generate(tokens=[4, 5, 6], max_new_tokens=6, **SEEDED)) == first
    assert drain_stream(fresh.generate(tokens=[7, 8], max_new_tokens=6, **SEEDED)) == went_on
    for s in (*sessions, fresh):
        assert s.close()
    server.wait_at_capacity(server.wait_healed())
    client.close()
