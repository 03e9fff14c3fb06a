"""The runbooks' per-replica steps, end to end on a real server: ``session-router sessions``
lists what a replica holds beside the router's pins (and marks an orphan), ``session-router
restart`` refuses while the replica holds sessions, and once they are drained away it replaces
the replica with a new, empty one whose pools account exactly."""

from __future__ import annotations

import pytest
import ray

from router.client import SessionClient
from router.control.api import ReplicaHealth
from router.ops import cli
from tests.support.cluster import wait_for
from tests.support.servers import serve_cluster


@pytest.fixture(scope="module")
def server(ray_cluster):
    with serve_cluster() as srv:
        yield srv


def run(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli.main(list(args))
    return code, capsys.readouterr().out


def test_sessions_lists_held_and_pinned_and_marks_an_orphan(server, capsys):
    ns = server.config.namespace
    with SessionClient(server.address) as client:
        sessions = [client.open(timeout=30) for _ in range(4)]
        replica_id = sessions[0].replica_id
        mine = sorted(s.id for s in sessions if s.replica_id == replica_id)
        code, out = run(capsys, "sessions", "--replica", replica_id, "--namespace", ns)
        assert code == 0, out
        for session_id in mine:
            assert f"{session_id}" in out and "ok" in out.split(session_id)[1].splitlines()[0]
        assert f"{len(mine)} held, {len(mine)} pinned" in out
        # An orphan: the router forgets a pin the replica still holds.
        orphan = mine[0]
        ray.get(server.server.router.forget.remote([orphan], None, replica_id))
        code, out = run(capsys, "sessions", "--replica", replica_id, "--namespace", ns)
        assert "ORPHAN" in out.split(orphan)[1].splitlines()[0], out
        assert f"{len(mine)} held, {len(mine) - 1} pinned" in out
        ray.get(server.replicas[replica_id].close_sessions.remote([orphan]))
        for session in sessions:
            session.close()
    server.assert_no_leaks()
    code, out = run(capsys, "sessions", "--replica", "replica-99", "--namespace", ns)
    assert code == 2 and "no replica replica-99" in out


def test_restart_refuses_a_replica_with_sessions_then_replaces_it_drained(server, capsys):
    ns = server.config.namespace
    with SessionClient(server.address) as client:
        session = client.open(timeout=30)
        victim = session.replica_id
        code, out = run(capsys, "restart", "--replica", victim, "--namespace", ns)
        assert code == 1 and "holds 1 sessions" in out and "--migrate" in out, out
        drained = client.drain(victim, migrate=True, timeout=60)
        assert drained.sessions_left == 0, drained
        code, out = run(capsys, "restart", "--replica", victim, "--namespace", ns)
        assert code == 0, out

        def replaced() -> bool:
            views = ray.get(server.server.router.views.remote(), timeout=30)
            health = {v.replica_id: v.health for v in views}
            return (
                health.get(victim) == ReplicaHealth.DEAD
                and len([h for h in health.values() if h == ReplicaHealth.HEALTHY])
                >= server.config.replicas
            )

        wait_for(replaced, 60, 0.2, f"{victim} replaced")
        live = server.wait_healed()
        assert victim not in live
        # The migrated session lives on, and a turn runs on it.
        ids, _, reason = session.complete(tokens=[1, 2, 3], max_new_tokens=2)
        assert len(ids) == 2 and reason
        session.close()
    server.assert_no_leaks(live)
