"""A session released by its replica while the router restarts leaves no pin behind.

The race ``tests/test_chaos.py`` hit: a gateway opens a session on a replica itself and pins it
at the router in the same moment; the router is restarting, so the pin waits (the gateway's
router client retries). The session's idle timeout ends it on the replica meanwhile, and the
replica's report of that release reaches the new router before the replica has registered
there: the router answers "register again" and, before the fix, the release was dropped. Then
the delayed pin landed, and the router pinned a session nobody held, forever.

Here the real ``SessionRouter`` actor (fresh: just restarted) gets the replica's reports from a
real ``RouterReporter`` and the gateway's pin through the real ``RouterClient``, in both racing
orders: the pin lands between the registration and the next report (it is pinned, then the
re-sent release forgets it), or after the release was told (it is refused, so the gateway
releases its side). Either way the router ends with no session.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from replica.actor.reporting import RouterReporter
from replica.api import PoolSnapshot, PoolStats, ReplicaDescription
from router.config import RouterConfig
from router.control.client import RouterClient
from router.control.router import SessionRouter

REPLICA = "replica-0"
DESC = ReplicaDescription(REPLICA, "node", "inc-1", 2, 64, 256, 256)


def snapshot(seq: int) -> PoolSnapshot:
    pools = (PoolStats("mamba", 8, 8, 0, 0),)
    return PoolSnapshot(REPLICA, DESC.incarnation, pools, 0, 0, 0, time.time(), seq)


def fresh_router():
    """A router as it is just after a restart: it knows no replica and no session."""
    config = RouterConfig(stale_after_s=60.0)
    return ray.remote(SessionRouter).options(max_concurrency=100).remote(config)


def reporter_of(router) -> RouterReporter:
    seqs = iter(range(1, 1000))

    async def registration() -> tuple:
        # the replica holds no session now: the idle timeout has released it
        return None, DESC, {}, snapshot(next(seqs)), None, {}, []

    return RouterReporter(REPLICA, router, lambda: snapshot(next(seqs)), registration)


@pytest.mark.parametrize("pin_lands", ["before the re-sent release", "after the re-sent release"])
def test_an_idle_release_during_a_router_restart_leaves_no_pin(ray_cluster, pin_lands):
    router = fresh_router()
    client = RouterClient(router)
    reporter = reporter_of(router)

    async def race() -> tuple[list[bool], int]:
        reporter.note_released(["s-1"])  # its idle timeout ended it during the restart
        await reporter._report()  # unknown replica: it registers (the release must not be lost)
        if pin_lands == "before the re-sent release":
            pinned = await client.update_sessions(
                pins=[("s-1", REPLICA, "", 0.0)], forgets=[], snapshots=[]
            )
            await reporter._report()
        else:
            await reporter._report()
            pinned = await client.update_sessions(
                pins=[("s-1", REPLICA, "", 0.0)], forgets=[], snapshots=[]
            )
        return pinned, await client.session_count()

    pinned, count = asyncio.run(race())
    assert count == 0, f"the router pins {count} session(s) no replica holds"
    if pin_lands == "after the re-sent release":
        assert pinned == [False]  # refused: the gateway releases its side and opens anew
    ray.kill(router)
