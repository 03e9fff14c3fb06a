"""End to end, the seed's bug brought back in a real ``session-router serve`` and caught by every
detector outside the replica.

The serve process gets ``SESSION_ROUTER_FAILPOINTS=leak_mamba_on_release,leak_kv_on_release`` in
its environment, which it passes to its replica (non-strict, as in production), so every release
leaks the session's 3 mamba slots and its KV page. Then: /metrics shows
``session_router_pool_leaked_slots`` with exactly the leaked count within seconds (so does
AdminService.ListReplicas), and a real Prometheus loaded with deploy/prometheus/alerts.yml puts
``MambaSlotsLeaked`` (mamba) and ``PoolAccountingMismatch`` (kv_tokens) into pending, and the
same rules with their ``for:`` cut to a second fire. The serve is stopped with SIGINT while
sessions are open.
"""

from __future__ import annotations

import signal
import time

import pytest

from replica.failpoints import ENV_VAR
from router.client import SessionClient
from tests.support.metrics import parse_samples, select
from tests.support.prometheus import Prometheus, http_get, require_tool
from tests.support.serve_process import ServeProcess, stop_with_sessions_open

MAMBA_PER_SESSION = 3  # 1 + 2 track buffers
KV_PER_SESSION = 16  # one page: a turn of 8 input and 4 new tokens folds 11 tokens in
SERVE_ARGS = [
    "--replicas",
    "1",
    "--max-sessions",
    "16",
    "--mamba-track-buffers",
    "2",
    "--kv-tokens",
    "2048",
    "--page-size",
    "16",
    "--max-context",
    "512",
]


class Leaks:
    """Sessions leaked so far in this module's serve: the expected leak, counted by the test."""

    def __init__(self, serve: ServeProcess) -> None:
        self.serve = serve
        self.sessions = 0

    def make(self, n: int) -> None:
        """Open ``n`` sessions, run a turn on each and close it: each close leaks."""
        with SessionClient(self.serve.grpc_address) as client:
            for _ in range(n):
                with client.open(timeout=30) as session:
                    ids, _, reason = session.complete(tokens=list(range(1, 9)), max_new_tokens=4)
                    assert len(ids) == 4 and reason, (ids, reason)
                self.sessions += 1

    @property
    def want(self) -> dict[str, int]:
        n = self.sessions
        return {"mamba": n * MAMBA_PER_SESSION, "kv_tokens": n * KV_PER_SESSION, "req": 0}


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    require_tool("prometheus")  # fail (never skip) before the serve start
    log = tmp_path_factory.mktemp("leaky-serve") / "serve.log"
    env = {ENV_VAR: "leak_mamba_on_release,leak_kv_on_release"}
    server = ServeProcess.start(log, SERVE_ARGS, env=env)
    try:
        yield server
    finally:
        stop_with_sessions_open(server, signal.SIGINT)


@pytest.fixture(scope="module")
def leaks(serve) -> Leaks:
    return Leaks(serve)


@pytest.fixture(scope="module")
def prom(serve, tmp_path_factory):
    server = Prometheus.start(
        tmp_path_factory.mktemp("prometheus"), serve.metrics_port, short_for=True
    )
    try:
        yield server
    finally:
        server.stop()


def exposed_leaks(serve: ServeProcess) -> dict[str, float]:
    samples = parse_samples(http_get(serve.metrics_url).decode())
    return {
        pool: sum(select(samples, "session_router_pool_leaked_slots", pool=pool))
        for pool in ("mamba", "kv_tokens", "req")
    }


def test_metrics_show_exactly_the_leaked_slots_within_seconds(serve, leaks):
    leaks.make(2)
    deadline = time.monotonic() + 10
    while (got := exposed_leaks(serve)) != leaks.want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got == leaks.want, f"/metrics shows leaked {got}; {leaks.sessions} releases leaked"
    with SessionClient(serve.grpc_address) as client:
        (replica,) = client.replicas()
    leaked = {p.pool: p.leaked for p in replica.pools}
    assert {pool: leaked.pop(pool) for pool in leaks.want} == leaks.want
    assert not any(leaked.values()), f"pools the failpoints do not touch show a leak: {leaked}"


def test_prometheus_fires_the_leak_alerts(serve, prom, leaks):
    leaks.make(1)
    want = leaks.want
    # pending as soon as the rule's expression holds; firing only after its `for:` (minutes)
    states = {"pending", "firing"}
    prom.wait_alert("MambaSlotsLeaked", states, want["mamba"], replica="replica-0")
    prom.wait_alert(
        "PoolAccountingMismatch", states, want["kv_tokens"], replica="replica-0", pool="kv_tokens"
    )
    # the same rules with their `for:` cut to a second fire, each with its exact leak
    prom.wait_alert("MambaSlotsLeaked", {"firing"}, want["mamba"], short_for=True)
    prom.wait_alert(
        "PoolAccountingMismatch", {"firing"}, want["kv_tokens"], short_for=True, pool="kv_tokens"
    )
    # the mamba leak pages once, as MambaSlotsLeaked, not also as an accounting mismatch
    assert not prom.alerts("PoolAccountingMismatch", pool="mamba")
    assert not prom.alerts("PoolAccountingMismatch", short_for=True, pool="mamba")
