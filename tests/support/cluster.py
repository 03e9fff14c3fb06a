"""Helpers of the end-to-end tests: a real ``Server`` (local Ray, loopback gRPC, the tiny-bamba
model) run on its own event loop in a background thread, so tests are plain sync code that may
block (``ray.get``, blocking gRPC) without stalling the gateway; and checks of the replicas' pools
through their actors.

Every test process shares one local Ray instance (the ``ray_cluster`` fixture of conftest.py);
each ``ServerThread`` puts its named actors in a namespace of its own, so servers of different
test modules never see each other's actors.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterable

import grpc
import ray

from replica.api import PoolSnapshot
from replica.checkpoints.outbox import STALL_S
from router.config import ServeConfig
from router.control.api import FleetView, ReplicaHealth
from router.ops.serve import Server

SMALL = dict(
    replicas=2,
    max_sessions=8,
    kv_tokens=4096,
    max_context=512,
    page_size=16,
    grpc_port=0,
    metrics_port=0,
    http_port=0,
    strict=True,
)
_servers = itertools.count()


# How long a replica's pools may take to settle after its last session closed: a store that
# stops acknowledging holds its checkpoint accounting open until the replica's stall bound
# (STALL_S) ends its stream (docs/checkpoint-stores.md); the rest is margin for a loaded box.
SETTLE_S = 3 * STALL_S


class ServerThread:
    """A ``Server`` on a private event loop thread; ``call`` runs a coroutine there."""

    def __init__(self, **overrides) -> None:
        namespace = f"test-{os.getpid()}-{next(_servers)}"
        self.config = ServeConfig.from_flags(**{**SMALL, "namespace": namespace, **overrides})
        self.server = Server(self.config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="server-loop", daemon=True
        )

    def call(self, coro, timeout: float | None = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> ServerThread:
        self.thread.start()
        try:
            self.call(self.server.start(), timeout=300)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            if self.thread.is_alive():
                self.call(self.server.stop(), timeout=120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    @property
    def address(self) -> str:
        return self.server.grpc_address

    def fleet(self) -> FleetView:
        """The controller's replicas, their stores, those starting and the count it keeps."""
        return self.call(self.server.controller.fleet_view(), timeout=60)

    @property
    def replicas(self) -> dict:
        return self.fleet().replicas

    @property
    def stores(self) -> dict:
        return self.fleet().stores

    def sigkill_replica(self, replica_id: str) -> None:
        """Kill the replica's worker process the hard way (no Ray shutdown path runs)."""
        os.kill(actor_pid(self.replicas[replica_id]), signal.SIGKILL)

    def start_replicas(self, count: int, failpoints: frozenset[str] = frozenset()) -> list[str]:
        """``count`` replicas more, started by the controller (beyond the count it keeps), with
        ``failpoints`` on in them."""
        return self.call(self.server.controller.start_replicas(count, failpoints), timeout=300)

    def wait_healed(self, timeout: float = 60.0) -> list[str]:
        """Wait until the router lists ``--replicas`` healthy replicas and none is starting
        (dead ones are replaced); returns the healthy ones."""

        def healed() -> list[str]:
            views = ray.get(self.server.router.views.remote(), timeout=30)
            live = [v.replica_id for v in views if v.health == ReplicaHealth.HEALTHY]
            done = len(live) >= self.config.replicas and not self.fleet().starting
            return live if done else []

        return wait_for(healed, timeout, 0.1, "the cluster to be back to --replicas replicas")

    # ----- views of the replicas, through their actors ----------------------------------------

    def sessions_on(self, replica_ids: Iterable[str] | None = None) -> dict[str, set[str]]:
        replicas = self.replicas  # one look-up: each is a call to the controller
        ids = list(replicas if replica_ids is None else replica_ids)
        lists = ray.get([replicas[r].list_sessions.remote() for r in ids], timeout=60)
        return {r: set(s) for r, s in zip(ids, lists)}

    def snapshots(self, replica_ids: Iterable[str] | None = None) -> dict[str, PoolSnapshot]:
        replicas = self.replicas
        ids = list(replicas if replica_ids is None else replica_ids)
        snaps = ray.get([replicas[r].snapshot.remote(True) for r in ids], timeout=60)
        for r, snap in zip(ids, snaps):
            assert isinstance(snap, PoolSnapshot), f"{r}: {snap}"
        return dict(zip(ids, snaps))

    def assert_no_leaks(
        self, replica_ids: Iterable[str] | None = None, at_capacity: bool = False
    ) -> None:
        """leaked == 0 on every pool (exact snapshots and the replicas' own invariant check);
        with ``at_capacity``, also no session open and every pool free but for what cached
        states hold (the replica evicts them for any session that needs the room)."""
        replicas = self.replicas
        ids = list(replicas if replica_ids is None else replica_ids)
        checked = ray.get([replicas[r].check_invariant.remote() for r in ids], timeout=60)
        for r, snap in zip(ids, checked):
            assert isinstance(snap, PoolSnapshot), f"{r}: invariant check failed: {snap}"
        for r, snap in self.snapshots(ids).items():
            for stats in snap.pools:
                assert stats.leaked == 0, f"{r}: {stats.describe()}"
                if at_capacity:
                    assert stats.free + stats.cached == stats.capacity, f"{r}: {stats.describe()}"
            if at_capacity:
                assert snap.open_sessions == 0, f"{r}: {snap.open_sessions} sessions open"
                assert snap.running_requests == snap.waiting_requests == 0, r
                unacked = snap.checkpoints.unacked
                assert unacked == 0, f"{r}: {unacked} checkpoint entries not acknowledged yet"

    def wait_at_capacity(
        self, replica_ids: Iterable[str] | None = None, timeout: float = SETTLE_S
    ) -> None:
        """Poll until every replica holds no session and its pools are free, then check."""
        ids = list(self.replicas if replica_ids is None else replica_ids)
        deadline = time.monotonic() + timeout
        while True:
            done = all(snap.at_capacity for snap in self.snapshots(ids).values())
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assert_no_leaks(ids, at_capacity=True)


def actor_pid(handle) -> int:
    """The process id of the actor's worker (to signal it as a node's fault would)."""
    return ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()), timeout=30)


def opens_waiting(server: ServerThread) -> int:
    """OpenSession calls the router is placing now (on a full cluster: waiting for room), read
    from the router actor's table of opens in flight."""
    count = server.server.router.__ray_call__.remote(lambda router: len(router.opener.running))
    return ray.get(count, timeout=30)


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def rpc_error(fn, *args, **kwargs) -> grpc.RpcError:
    """Call ``fn`` (draining a stream it returns); returns the RpcError it must raise."""
    try:
        result = fn(*args, **kwargs)
        if isinstance(result, grpc.Call):  # a response stream
            for _ in result:
                pass
    except grpc.RpcError as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not fail")


def tokens(seed: int, n: int = 8) -> list[int]:
    """``n`` reproducible token ids in tiny-bamba's vocabulary."""
    return [(seed * 31 + i * 7) % 250 + 1 for i in range(n)]


def drain_stream(stream) -> tuple[list[int], int, int]:
    """Drain a Generate stream: (token ids, finish reason, committed tokens of the last chunk)."""
    ids, reason, committed = [], 0, 0
    for chunk in stream:
        ids.extend(chunk.token_ids)
        if chunk.finish_reason:
            reason, committed = chunk.finish_reason, chunk.committed_tokens
    return ids, reason, committed
